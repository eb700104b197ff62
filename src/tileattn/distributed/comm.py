"""The ring's process group and transfers: each rank's two neighbours and the
posted send/receive pairs between them, with failures reported as
:class:`RingCommunicationError`."""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

__all__ = ["RingCommunicationError"]


class RingCommunicationError(RuntimeError):
    """A transfer between ring neighbours failed or timed out: a peer rank
    failed, stopped, or did not make the same call.  How long a rank waits is
    the process group's timeout (``init_process_group(timeout=...)``)."""


# ---------------------------------------------------------------------------
# Process group and transfers
# ---------------------------------------------------------------------------
def _resolve_group(group):
    if not dist.is_available():
        raise ValueError("group: this PyTorch build has no torch.distributed")
    if group is None:
        if not dist.is_initialized():
            raise ValueError("group=None uses the default process group, which is not initialized: call "
                             "torch.distributed.init_process_group(...) first, or pass group=")
        group = dist.group.WORLD
    elif not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed.ProcessGroup or None, got {type(group).__name__}")
    if dist.get_rank(group) < 0:
        raise ValueError("group: this process is not a member of the given process group")
    return group


class _Ring:
    """The two neighbours of this rank in ``group`` and the transfers to them."""

    def __init__(self, group):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.next_rank = (self.rank + 1) % self.world
        self.prev_rank = (self.rank - 1) % self.world
        # P2POp takes global ranks
        self._next = dist.get_global_rank(group, self.next_rank)
        self._prev = dist.get_global_rank(group, self.prev_rank)

    def start(self, send: torch.Tensor, recv: torch.Tensor, tag: int, what: str) -> list:
        """Post: ``send`` to the next rank, ``recv`` from the previous one."""
        ops_ = [dist.P2POp(dist.isend, send, self._next, self.group, tag),
                dist.P2POp(dist.irecv, recv, self._prev, self.group, tag)]
        with self._failures(what):
            return dist.batch_isend_irecv(ops_)

    def finish(self, works: list, what: str) -> None:
        """Wait for posted transfers (on CUDA: make the current stream wait)."""
        with self._failures(what):
            for w in works:
                w.wait()

    @contextlib.contextmanager
    def _failures(self, what: str):
        try:
            yield
        except Exception as exc:  # the backends raise RuntimeError subclasses: say which ring step failed
            raise RingCommunicationError(
                f"ring_attention: {what} on rank {self.rank} of {self.world} failed (receiving from rank "
                f"{self.prev_rank}, sending to rank {self.next_rank}): a peer rank failed, stopped, or did not "
                f"make the same call. Backend error: {exc}") from exc
