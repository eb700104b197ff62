#!/bin/bash
# after folding ONE_LOOP into the tail loop's call: decode tests and a short timing
PYTHONPATH=$PWD/snap/c/src TILEATTN_SKIP_BROWSER=1 timeout 100 python -m pytest -n 16 -q -p no:warnings tests/test_decode.py tests/test_decode_smem.py > $OUT/pytest_decode_last.log 2>&1
tail -2 $OUT/pytest_decode_last.log
cd benchmarks
PYTHONPATH=$PWD/../snap/c/src timeout 60 python decode_cases.py 4096,16384,4096-1 cudnn,contig,page16 D 1 2>&1 | grep -v Warn | tee $OUT/last.log
