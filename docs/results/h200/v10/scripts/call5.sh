#!/bin/bash
# v10 call 5: one loop on pages read by descriptor (working tree) against
# main (snap/h): decode tests, then paired graph replay with ragged lengths
# (4096-1, 4096-64: last tile moved within its page; 4096-192: a short last page)
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $OUT/paged_one_loop.log
PYTHONPATH=$PWD/src TILEATTN_SKIP_BROWSER=1 timeout 100 python -m pytest -n 16 -q -p no:warnings tests/test_decode.py tests/test_decode_smem.py > $OUT/pytest_decode_paged_one_loop.log 2>&1
tail -2 $OUT/pytest_decode_paged_one_loop.log; el tests
cd benchmarks
for r in 1 2; do for t in h new; do
  if [ $t = new ]; then P=$PWD/../src; else P=$PWD/../snap/h/src; fi
  PYTHONPATH=$P timeout 60 python decode_cases.py 4096,4096-1,4096-64,4096-192,16384,16384-1 cudnn,contig,page256 $t$r 1 2>&1 | grep -v Warn >> $OUT/paged_one_loop.log
  el $t$r
done; done
cat $OUT/paged_one_loop.log
