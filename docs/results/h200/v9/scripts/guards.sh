#!/bin/bash
# paired: main vs loop guards, graph replay, then decode tests on the variant
cd benchmarks
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee -a $OUT/guards.log
for r in 1 2; do
  for t in main var; do
    PYTHONPATH=$PWD/../snap/$t/src python decode_cases.py 4096,16384,65536 cudnn,contig,page256,page16,cudnn2 $t-r$r 3 2>&1 | grep -v Warn >> $OUT/guards.log
  done
done
cd ..
cp -r tests snap/var/ 2>/dev/null
PYTHONPATH=$PWD/snap/var/src TILEATTN_SKIP_BROWSER=1 timeout 200 python -m pytest -n 14 -q -p no:warnings tests/test_decode.py tests/test_decode_smem.py > $OUT/pytest_var_decode.log 2>&1
tail -3 $OUT/pytest_var_decode.log
cat $OUT/guards.log
