"""The direct-launch cache (launch._run) keys calls by its own reading of
Triton's specialisation rules.  A key at least as fine as Triton's is safe
(a miss takes the regular path); a coarser one would launch a kernel compiled
for other arguments.  These cases compare the two on the installed Triton."""
import itertools

import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from tileattn import launch

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
        if launch._spec(a, False) == launch._spec(b, False):
            assert _triton_key(a) == _triton_key(b), (a, b)
    # and the key does tell apart what Triton tells apart (a key that merges
    # everything would pass the check above)
    keys = {_triton_key(v) for v in values}
    assert len({launch._spec(v, False) for v in values}) >= len(keys)


def test_direct_launch_key_none_and_constexpr():
    assert _triton_key(None)[0] == "constexpr"
    assert launch._spec(None, False) != launch._spec(0, False)
    assert launch._spec("tf32", True) == "tf32" and launch._spec(64, True) == 64


def test_unknown_argument_types_take_the_regular_path():
    import numpy as np
    with pytest.raises(TypeError):
        launch._spec(np.int64(16), False)


def test_direct_launches_only_on_checked_triton_versions(monkeypatch):
    import triton
    checked = triton.__version__.startswith(launch.DIRECT_LAUNCH_VERSIONS)
    monkeypatch.delenv("TILEATTN_DIRECT_LAUNCH", raising=False)
    assert launch._direct_enabled() == checked
    monkeypatch.setenv("TILEATTN_DIRECT_LAUNCH", "0")
    assert not launch._direct_enabled()
