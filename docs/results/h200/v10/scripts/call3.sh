#!/bin/bash
# v10 call 3: rotated tile order (each program starts at its own place in its
# split, exp/rotated-tiles) against main; cache placements on main
# snap/r: main at 3203ee6 with scripts/rotate.patch applied (TILEATTN_ROTATE=1 turns the rotation on)
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cd benchmarks
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $OUT/rotate.log $OUT/placement.log
L=4096,16384,131072
C=cudnn,contig,page16,page256
for r in 1 2; do
  PYTHONPATH=$PWD/../snap/c/src timeout 100 python decode_cases.py $L $C c$r 1 2>&1 | grep -v Warn >> $OUT/rotate.log; el c$r
  TILEATTN_ROTATE=0 PYTHONPATH=$PWD/../snap/r/src timeout 100 python decode_cases.py $L $C r0$r 1 2>&1 | grep -v Warn >> $OUT/rotate.log; el r0$r
  TILEATTN_ROTATE=1 PYTHONPATH=$PWD/../snap/r/src timeout 100 python decode_cases.py $L $C r1$r 1 2>&1 | grep -v Warn >> $OUT/rotate.log; el r1$r
done
PYTHONPATH=$PWD/../snap/c/src timeout 100 python decode_cases.py 4096,16384 cudnn,contig,page256,page256i,page1024,page4096,page4096i P 2 2>&1 | grep -v Warn >> $OUT/placement.log; el P
cat $OUT/rotate.log $OUT/placement.log
