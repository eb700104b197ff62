#!/bin/bash
# v10 call 4: the shipped tree (ONE_LOOP through the tail call): graph-replay
# table, then the whole GPU suite
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $OUT/final.log
(cd benchmarks && PYTHONPATH=$PWD/../src timeout 200 python decode_cases.py 4096,16384,65536,131072,4096-1,16384-1 cudnn,contig,page256,page16,page16i F 2 2>&1 | grep -v Warn >> $OUT/final.log)
el table
PYTHONPATH=$PWD/src TILEATTN_SKIP_BROWSER=1 timeout 420 python -m pytest -n 16 -q -p no:warnings tests > $OUT/pytest_gpu_all.log 2>&1
tail -3 $OUT/pytest_gpu_all.log; el suite
cat $OUT/final.log
