#!/bin/bash
# A: one loop on descriptor loads of contiguous caches; B: also on the pointer path.
# Timing first (graph replay), then the whole suite on B.
cd benchmarks
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee -a $OUT/final.log
PYTHONPATH=$PWD/../snap/a/src python decode_cases.py 4096,16384,4096-1,16384-1 cudnn,contigp,page16 A 2 2>&1 | grep -v Warn >> $OUT/final.log
PYTHONPATH=$PWD/../snap/var/src python decode_cases.py 4096,16384,65536,4096-1,16384-1 cudnn,contig,contigp,page256,page16 B 2 2>&1 | grep -v Warn >> $OUT/final.log
cd .. && PYTHONPATH=$PWD/snap/var/src TILEATTN_SKIP_BROWSER=1 timeout 400 python -m pytest -n 16 -q -p no:warnings tests > $OUT/pytest_gpu_all.log 2>&1
tail -4 $OUT/pytest_gpu_all.log
cat $OUT/final.log
