#!/bin/bash
# v10 call 1: shipped kernel (snap/c = main) decode tests on the GPU; layouts
# (256-token pages by pointer, sorted shuffled 16-token pages); then shipped
# against the fold of ONE_LOOP into the tail call (snap/f), alternating
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $OUT/layouts.log $OUT/pair.log
PYTHONPATH=$PWD/snap/c/src TILEATTN_SKIP_BROWSER=1 timeout 150 python -m pytest -n 16 -q -p no:warnings tests/test_decode.py tests/test_decode_smem.py > $OUT/pytest_decode_shipped.log 2>&1
tail -2 $OUT/pytest_decode_shipped.log; el tests
cd benchmarks
PYTHONPATH=$PWD/../snap/c/src timeout 200 python decode_cases.py 4096,16384,131072,4096-1 cudnn,contig,page256,page256p,page16,page16s,page16i L 2 2>&1 | grep -v Warn >> $OUT/layouts.log
el layouts
for r in 1 2; do for t in c f; do
  PYTHONPATH=$PWD/../snap/$t/src timeout 80 python decode_cases.py 4096,16384,4096-1 cudnn,contig,page16 $t$r 2 2>&1 | grep -v Warn >> $OUT/pair.log
  el $t$r
done; done
cat $OUT/layouts.log $OUT/pair.log
