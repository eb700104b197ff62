"""The direct-launch cache (runtime.run) keys calls by its own reading of
Triton's specialisation rules.  A key at least as fine as Triton's is safe
(a miss takes the regular path); a coarser one would launch a kernel compiled
for other arguments.  These cases compare the two on the installed Triton."""
import itertools

import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from tileattn.launch import runtime

native = pytest.importorskip("triton._C.libtriton").native_specialize_impl
backend = pytest.importorskip("triton.backends.nvidia.compiler").CUDABackend


def _triton_key(v):
    return native(backend, v, False, True, True)


def _desc(dtype, block, offset=0):
    t = torch.zeros(2, 4, 160, 64, dtype=dtype).flatten()[offset:offset + 2 * 4 * 128 * 64].view(2, 4, 128, 64)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block)


VALUES = {
    "ints": [0, 1, 2, 15, 16, 17, 32, 48, -1, -16, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, 2**32, -2**31,
             -2**31 - 16, 2**62, 2**63 - 16, 2**63],
    "floats": [0.0, 1.0, 0.125, -3.5, 1e30],
    "bools": [True, False],
    "tensors": [torch.zeros(64, dtype=torch.bfloat16), torch.zeros(65, dtype=torch.bfloat16)[1:],
                torch.zeros(64, dtype=torch.float16), torch.zeros(64, dtype=torch.float32),
                torch.zeros(72, dtype=torch.float32)[8:], torch.zeros(64, dtype=torch.int32)],
    "descriptors": [_desc(torch.bfloat16, [1, 1, 64, 64]), _desc(torch.bfloat16, [1, 1, 128, 64]),
                    _desc(torch.float16, [1, 1, 64, 64]), _desc(torch.bfloat16, [1, 1, 64, 64], offset=8)],
}


@pytest.mark.parametrize("kind", sorted(VALUES))
def test_direct_launch_key_is_at_least_as_fine_as_triton(kind):
    values = VALUES[kind]
    for a, b in itertools.product(values, repeat=2):
        if runtime._spec(a, False) == runtime._spec(b, False):
            assert _triton_key(a) == _triton_key(b), (a, b)
    # and the key does tell apart what Triton tells apart (a key that merges
    # everything would pass the check above)
    keys = {_triton_key(v) for v in values}
    assert len({runtime._spec(v, False) for v in values}) >= len(keys)


def test_direct_launch_key_none_and_constexpr():
    assert _triton_key(None)[0] == "constexpr"
    assert runtime._spec(None, False) != runtime._spec(0, False)
    assert runtime._spec("tf32", True) == "tf32" and runtime._spec(64, True) == 64


def test_unknown_argument_types_take_the_regular_path():
    import numpy as np
    with pytest.raises(TypeError):
        runtime._spec(np.int64(16), False)


def test_direct_launches_only_on_checked_triton_versions(monkeypatch):
    import triton
    checked = triton.__version__.startswith(runtime.DIRECT_LAUNCH_VERSIONS)
    monkeypatch.delenv("TILEATTN_DIRECT_LAUNCH", raising=False)
    assert runtime._direct_enabled() == checked
    monkeypatch.setenv("TILEATTN_DIRECT_LAUNCH", "0")
    assert not runtime._direct_enabled()


# ---------------------------------------------------------------------------
# launch plans: what a plan keeps of the launches it recorded
# ---------------------------------------------------------------------------
class _FakeCompiled:
    function = packed_metadata = None

    def __init__(self):
        self.calls = []

    def launch_metadata(self, grid, stream, *values):
        return None

    def run(self, gx, gy, gz, stream, function, packed, meta, enter, exit_, *values):
        self.calls.append(((gx, gy, gz), stream, values))


class _FakeDriver:
    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 1234


def _record(tensors, values):
    compiled = _FakeCompiled()
    runtime.begin_record()
    runtime.record((compiled, (3, 2, 1), values))
    runtime.end_record(("test",), tensors)
    return compiled, runtime.PLANS.pop(("test",), None)


def test_plan_fills_this_calls_tensors_and_holds_none(monkeypatch):
    import gc
    import weakref
    monkeypatch.setattr(runtime.triton.runtime.driver, "_active", _FakeDriver())
    q, o = torch.randn(2, 4, 128, 64), torch.empty(2, 4, 128, 64)
    desc = runtime.descriptor(q)
    desc.block_shape = [1, 1, 64, 64]
    compiled, plan = _record({"q": q, "o": o}, [desc, o, 7, 0.5, None, True])
    assert plan is not None and len(plan) == 1
    # the plan keeps neither tensor (nor the descriptor's base)
    alive = weakref.ref(q)
    del q, o, desc
    gc.collect()
    assert alive() is None
    q2, o2 = torch.randn(2, 4, 128, 64), torch.empty(2, 4, 128, 64)
    runtime.replay(plan, {"q": q2, "o": o2})
    (grid, stream, values), = compiled.calls
    assert grid == (3, 2, 1) and stream == 1234
    assert isinstance(values[0], TensorDescriptor) and values[0].base is q2
    assert values[0].block_shape == [1, 1, 64, 64] and values[0].shape == [2, 4, 128, 64]
    assert values[1] is o2 and values[2:] == (7, 0.5, None, True)


@pytest.mark.parametrize("case", ["unnamed-tensor", "aliased-names", "regular-launch"])
def test_no_plan_when_a_launch_cannot_be_replayed(case):
    q, o = torch.randn(4, 16), torch.empty(4, 16)
    if case == "unnamed-tensor":       # e.g. a .contiguous() copy made inside the launcher
        _, plan = _record({"q": q, "o": o}, [q, o, q.clone()])
    elif case == "aliased-names":      # q is k: a later call of the key need not alias them
        _, plan = _record({"q": q, "k": q, "o": o}, [q, q, o])
    else:                              # a launch that went through Triton's own path
        runtime.begin_record()
        runtime.record(None)
        runtime.end_record(("test",), {"q": q})
        plan = runtime.PLANS.pop(("test",), None)
    assert plan is None
