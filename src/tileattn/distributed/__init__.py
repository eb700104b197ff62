"""Ring attention (context parallelism) on torch.distributed.

``ring_attention`` computes exact attention over a sequence sharded across
the ranks of a process group (NCCL on GPUs, gloo on CPUs): K/V blocks travel
around the ring while each rank merges partial outputs through their
log-sum-exp.  ``shard_sequence`` / ``unshard_sequence`` convert between the
full sequence and the per-rank shards (``zigzag`` or ``contiguous`` layout);
``RingProfile`` records per-step compute and wait times.  See
docs/distributed.md.

Importing this subpackage does not initialize anything; ``import tileattn``
does not import it.
"""
from .layout import LAYOUTS, shard_sequence, unshard_sequence
from .profile import RingProfile, StepRecord, time_ring_exchange
from .comm import RingCommunicationError
from .ring import ring_attention
from .schedule import BlockPlan, block_plan, ring_plan

__all__ = ["ring_attention", "shard_sequence", "unshard_sequence", "LAYOUTS", "RingProfile", "StepRecord",
           "RingCommunicationError", "time_ring_exchange", "BlockPlan", "block_plan", "ring_plan"]
