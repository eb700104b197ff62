#!/usr/bin/env bash
# One GPU run: environment, the test suite on the GPU, the side-by-side
# comparison.  Logs land in $OUT if set, else ./out.  Usage: bash benchmarks/gpu_run.sh [tests|bench|all]
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src TILEATTN_SKIP_BROWSER=1
what=${1:-all}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader
python3 -c "import torch,triton;print('torch', torch.__version__, 'triton', triton.__version__)"
if [[ $what == tests || $what == all ]]; then
  timeout ${TEST_TIMEOUT:-330} python3 -m pytest -n 12 -q -p no:warnings --maxfail=40 -rf --tb=line tests \
    > "$OUT/pytest.log" 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed|^E " "$OUT/pytest.log" | head -40
fi
if [[ $what == bench || $what == all ]]; then
  timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/compare_sdpa.py --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -40
fi
