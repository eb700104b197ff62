"""decode_cases.py with the combine of split launches left out of the
captured CUDA graphs (eager calls, such as the accuracy check, still run
it), so that graph replay times the partial kernel alone: what a combine
merged into the partial kernel could save at most.  Run from benchmarks/
with TILEATTN_DIRECT_LAUNCH=0 (no launch plans)."""
import sys

import torch

from tileattn import launch_decode

_real = launch_decode.combine_splits


def _first_only(o_part, l_part, out, lse):
    if not torch.cuda.is_current_stream_capturing():
        _real(o_part, l_part, out, lse)


launch_decode.combine_splits = _first_only
import decode_cases  # noqa: E402

sys.exit(decode_cases.main(sys.argv[1:]))
