#!/bin/bash
# paired: main (loop guards) vs one loop, full and ragged caches; then decode tests on the variant
cd benchmarks
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee -a $OUT/oneloop.log
for t in main var; do
  PYTHONPATH=$PWD/../snap/$t/src python decode_cases.py 4096,16384,65536,4096-1,16384-1,65536-1 cudnn,contig,page256,page16 $t 3 2>&1 | grep -v Warn >> $OUT/oneloop.log
done
cd ..
cd snap/var && PYTHONPATH=$PWD/src TILEATTN_SKIP_BROWSER=1 timeout 150 python -m pytest -n 14 -q -p no:warnings tests/test_decode.py tests/test_decode_smem.py > $OUT/pytest_oneloop_decode.log 2>&1
cd ../..; tail -3 $OUT/pytest_oneloop_decode.log
cat $OUT/oneloop.log
