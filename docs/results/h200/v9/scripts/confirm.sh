#!/bin/bash
# the final rule (ONE_LOOP for contiguous caches by descriptor and paged caches by pointer):
# decode tests, then graph replay with 128k and in-order pages
PYTHONPATH=$PWD/snap/c/src TILEATTN_SKIP_BROWSER=1 timeout 120 python -m pytest -n 16 -q -p no:warnings tests/test_decode.py tests/test_decode_smem.py > $OUT/pytest_decode_final.log 2>&1
tail -2 $OUT/pytest_decode_final.log
cd benchmarks
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee -a $OUT/confirm.log
PYTHONPATH=$PWD/../snap/c/src timeout 200 python decode_cases.py 4096,16384,131072,4096-1 cudnn,contig,contigp,page256,page16,page16i C 2 2>&1 | grep -v Warn >> $OUT/confirm.log
cat $OUT/confirm.log
