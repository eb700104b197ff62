#!/bin/bash
# v10 call 2: leading splits at 4k-16k with and without the combine launch
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cd benchmarks
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $OUT/lead_probe.log
export TILEATTN_DIRECT_LAUNCH=0 PYTHONPATH=$PWD/../snap/c/src:$PWD
L=4096,8192,16384,32768
C=contig@x4l940,contig@x4l900,contig@x3l920,contig@x2l960,contig@x4l970,page16@x4l940
for r in 1 2; do
timeout 120 python decode_cases.py $L cudnn,contig@x1,$C W$r 1 2>&1 | grep -v Warn >> $OUT/lead_probe.log; el W$r
timeout 120 python ../docs/results/h200/v10/scripts/nocombine.py $L cudnn,contig@x1,$C N$r 1 2>&1 | grep -v Warn >> $OUT/lead_probe.log; el N$r
done
cat $OUT/lead_probe.log
