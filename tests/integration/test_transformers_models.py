"""DeepSeek-V3 and Gemma under ``attn_implementation="tileattn"``.

Tiny randomly initialised configs, no downloads:

* DeepSeek-V3: multi-head latent attention, q and k at qk_nope + qk_rope =
  64 + 32 = 96, v at 64 (tileattn's V head dim Dv != D); a yarn rope whose
  mscale enters the softmax scale; a dense first layer and a small MoE
  (experts on transformers' eager implementation so that float64 runs).
* Gemma 2: head dim 256, attention logit softcapping, sliding-window layers
  (W = 5) alternating with global ones, ``query_pre_attn_scalar`` != head
  dim (so the scale is not 1/sqrt(D)), final logit softcapping.
* Gemma 3 (text): head dim 256, sliding-window and global layers with their
  own rope bases, q/k norms, ``query_pre_attn_scalar`` != head dim.
* Gemma 4 (text): head dim 256 on its sliding layers, 512 on its global
  ones (scale 1, q/k norms).

The weights are drawn at a larger ``initializer_range`` than the default
(0.1): the scores then reach the softcap (Gemma 2's logits move by ~0.2
without it) and the softmax is far from uniform, so a wrong scale, cap or
window shows well above the tolerance.

The float64 reference is transformers' ``"sdpa"`` implementation in float64
(torch's math kernel) where the model has one; Gemma 2 has none (SDPA has no
softcap) and its ``"eager"`` runs the softmax in float32 even for float64
inputs, so its reference is that eager attention restated with the softmax
in the inputs' dtype (``_gemma2_eager_float64``; in float32 it gives eager's
logits bit for bit, checked below).  The low-precision baseline of the
accuracy rule is ``"eager"`` in float32.  Checked: logits, the gradient of
every parameter, greedy ``generate()`` token for token (unpadded, left-padded,
static cache), a KV-cache chunk with Nq != Nk, and which tileattn calls ran.
"""
import dataclasses
import functools
import warnings
import zlib
from typing import Callable

import pytest
import torch

import tileattn
from tileattn.sdpa import TileattnFallbackWarning
from tileattn.testing import check_accuracy, left_padding, token_ids

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip("needs transformers >= 5 (switchable experts, DynamicCache(config=...))", allow_module_level=True)
from transformers import AttentionInterface, AttentionMaskInterface, AutoModelForCausalLM, DynamicCache  # noqa: E402

from tileattn.integrations import transformers as hf  # noqa: E402

from conftest import DEVICE, SEED_OFFSET  # noqa: E402

VOCAB = 97
WINDOW = 5
INIT = 0.1
REF64 = "gemma2-eager-float64"   # the Gemma 2 reference, registered below


def _deepseek_v3():
    from transformers import DeepseekV3Config
    return DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=64,
        qk_rope_head_dim=32, v_head_dim=64, n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
        topk_group=1, first_k_dense_replace=1, max_position_embeddings=64, initializer_range=INIT,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "beta_fast": 32, "beta_slow": 1},
        bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _gemma2():
    from transformers import Gemma2Config
    return Gemma2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=64,
                        sliding_window=WINDOW, attn_logit_softcapping=5.0, final_logit_softcapping=30.0,
                        max_position_embeddings=64, initializer_range=INIT, bos_token_id=1, eos_token_id=2,
                        pad_token_id=0)


def _gemma4():
    from transformers import Gemma4TextConfig
    return Gemma4TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=256, global_head_dim=512,
                            sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
                            hidden_size_per_layer_input=16, vocab_size_per_layer_input=VOCAB,
                            max_position_embeddings=64, initializer_range=INIT, bos_token_id=1, eos_token_id=2,
                            pad_token_id=0)


def _gemma3():
    from transformers import Gemma3TextConfig
    return Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=64,
                            sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
                            max_position_embeddings=64, initializer_range=INIT, bos_token_id=1, eos_token_id=2,
                            pad_token_id=0)


@dataclasses.dataclass(frozen=True)
class Model:
    config: Callable
    ref: str                   # the float64 reference implementation
    dims: tuple                # (q/k head dim, v head dim) of each kind of layer, every one run on tileattn
    softcap: float | None
    sliding: bool              # whether layer 0 slides
    extra: tuple = ()          # from_config keywords


MODELS = {
    "deepseek-v3": Model(_deepseek_v3, "sdpa", ((96, 64),), None, False, (("experts_implementation", "eager"),)),
    "gemma2": Model(_gemma2, REF64, ((256, 256),), 5.0, True),
    "gemma3": Model(_gemma3, "sdpa", ((256, 256),), None, True),
    # Gemma 4: head dim 256 on the sliding layers, 512 on the global ones
    "gemma4": Model(_gemma4, "sdpa", ((256, 256), (512, 512)), None, True),
}
ARCHS = sorted(MODELS)


def _gemma2_eager_float64(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None,
                          **kwargs):
    """transformers' Gemma 2 eager attention, the softmax in the inputs' dtype
    (eager's softmax is float32 whatever the inputs)."""
    group = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        weights = torch.tanh(weights / softcap) * softcap
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), None


@pytest.fixture(scope="module", autouse=True)
def _registered():
    tileattn.register_transformers()
    AttentionInterface.register(REF64, _gemma2_eager_float64)
    AttentionMaskInterface.register(REF64, AttentionMaskInterface()["eager"])   # eager's additive mask


def _seed(*parts) -> int:
    return zlib.crc32("-".join(map(str, parts)).encode()) + SEED_OFFSET


@functools.lru_cache(maxsize=None)
def models(arch: str) -> dict:
    """The same random weights as the float64 reference, eager float32 (the
    baseline) and tileattn float32, on DEVICE."""
    spec = MODELS[arch]
    extra = dict(spec.extra)
    torch.manual_seed(_seed(arch, "weights"))
    state = AutoModelForCausalLM.from_config(spec.config(), **extra).state_dict()
    out = {}
    for impl, dtype in ((spec.ref, torch.float64), ("eager", torch.float32), ("tileattn", torch.float32)):
        m = AutoModelForCausalLM.from_config(spec.config(), attn_implementation=impl, **extra)  # a config each
        m.load_state_dict(state)
        out[impl, dtype] = m.to(device=DEVICE, dtype=dtype).eval()
    for (impl, _), m in out.items():
        assert m.config._attn_implementation == impl
    return out


def _triple(arch):
    """(tileattn float32, reference float64, eager float32)."""
    ms = models(arch)
    return ms["tileattn", torch.float32], ms[MODELS[arch].ref, torch.float64], ms["eager", torch.float32]


@pytest.fixture
def attention_calls(monkeypatch):
    """(q shape, k shape, v shape, keywords) of every tileattn.attention call."""
    calls = []
    real = hf.api.attention

    def spy(q, k, v, **kw):
        calls.append((tuple(q.shape), tuple(k.shape), tuple(v.shape), kw))
        return real(q, k, v, **kw)

    monkeypatch.setattr(hf.api, "attention", spy)
    return calls


def _check_logits(name, arch, fwd, select=None):
    with torch.no_grad():
        got, ref, low = (fwd(m) for m in _triple(arch))
    if select is not None:
        got, ref, low = got[select], ref[select], low[select]
    check_accuracy(name, got, ref, low, torch.float32)


def _check_calls(arch, calls, n):
    """Every layer ran tileattn with its head dims, scale, softcap and window."""
    spec = MODELS[arch]
    m = models(arch)["tileattn", torch.float32]
    scales = {layer.self_attn.scaling for layer in m.model.layers}
    assert len(scales) == 1
    scale = scales.pop()
    assert all(abs(scale - d ** -0.5) > 1e-3 * scale for d, _ in spec.dims)   # not the default: the model's own
    windows, dims = set(), set()
    for q, k, v, kw in calls:
        assert q[-1] == k[-1] and (q[-1], v[-1]) in spec.dims
        dims.add((q[-1], v[-1]))
        assert kw["causal"] is True and kw["scale"] == scale and kw.get("softcap") == spec.softcap
        if q[2] == n:
            windows.add(kw.get("window"))
    assert windows == ({(WINDOW - 1, 0), None} if spec.sliding else {None})
    assert dims == set(spec.dims)


# ---------------------------------------------------------------------------
# logits
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_eager(arch, attention_calls):
    ids = token_ids(2, 21, vocab=VOCAB, seed=_seed(arch, "logits"))
    _check_logits(f"{arch} logits", arch, lambda m: m(ids).logits)
    _check_calls(arch, attention_calls, 21)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_on_kernels(arch, kernels, attention_calls):
    """The same through the Triton kernels (the interpreter here; the GPU path on CUDA)."""
    ids = token_ids(1, 19, vocab=VOCAB, seed=_seed(arch, "kernels"))
    _check_logits(f"{arch} logits (kernels)", arch, lambda m: m(ids).logits)
    _check_calls(arch, attention_calls, 19)


@pytest.mark.parametrize("arch", ARCHS)
def test_left_padded_batch_falls_back(arch):
    """Padding: torch's SDPA with the mask, or (Gemma 2's softcap) the
    materialised computation; logits of real tokens match."""
    ids = token_ids(3, 17, vocab=VOCAB, seed=_seed(arch, "pad"))
    mask = left_padding(3, 17)
    tileattn.sdpa.reset_fallback_warnings()
    with pytest.warns(TileattnFallbackWarning, match="explicit mask"):
        _check_logits(f"{arch} padded logits", arch, lambda m: m(ids, attention_mask=mask).logits,
                      select=mask.bool())


@pytest.mark.parametrize("arch", ARCHS)
def test_kv_cache_chunk(arch, attention_calls):
    """6 tokens after a cached prefix of 9: Nq = 6, bottom-right causal, no mask
    (Gemma's sliding layers keep only the last W - 1 keys: Nk = 4 + 6 there)."""
    ids = token_ids(2, 15, vocab=VOCAB, seed=_seed(arch, "chunk"))

    def chunked(m):
        cache = DynamicCache(config=m.config)
        m(ids[:, :9], past_key_values=cache, use_cache=True)
        return m(ids[:, 9:], past_key_values=cache, use_cache=True).logits

    _check_logits(f"{arch} chunk logits", arch, chunked)
    assert any(q[2] == 6 and k[2] == 15 for q, k, _, _ in attention_calls)


# ---------------------------------------------------------------------------
# generation
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["unpadded", "left-padded", "static-cache"])
@pytest.mark.parametrize("arch", ARCHS)
def test_generate_greedy_identical(arch, mode, attention_calls):
    """10 new tokens after 8 (past the window of 5)."""
    ids = token_ids(3, 8, vocab=VOCAB, seed=_seed(arch, "generate", mode))
    kw = dict(max_new_tokens=10, do_sample=False, pad_token_id=0)
    if mode == "left-padded":
        kw["attention_mask"] = left_padding(3, 8, pads=(3, 0, 1))
    if mode == "static-cache":   # unfilled cache slots: an explicit mask, the fallback
        kw["cache_implementation"] = "static"
    got_model, _, eager = _triple(arch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TileattnFallbackWarning)
        got = got_model.generate(ids, **kw)
    want = eager.generate(ids, **kw)
    assert torch.equal(got, want)
    if mode == "unpadded":   # prefill and the decoding steps (Nq = 1 on the cached keys) ran on tileattn
        assert any(q[2] == 8 for q, *_ in attention_calls)
        assert any(q[2] == 1 for q, *_ in attention_calls)


# ---------------------------------------------------------------------------
# backward
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_gradients_match_eager(arch, attention_calls):
    ids = token_ids(2, 16, vocab=VOCAB, seed=_seed(arch, "backward"))
    names = ("tileattn", "ref", "eager")
    grads = {}
    for name, m in zip(names, _triple(arch)):
        m.train()
        m.zero_grad(set_to_none=True)
        try:
            m(ids, labels=ids).loss.backward()
        finally:
            m.eval()
        grads[name] = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
        m.zero_grad(set_to_none=True)
    assert attention_calls
    n_params = sum(1 for _ in _triple(arch)[0].parameters())
    assert grads["tileattn"].keys() == grads["ref"].keys() and len(grads["ref"]) == n_params
    for name, got in grads["tileattn"].items():
        check_accuracy(f"{arch} grad {name}", got, grads["ref"][name], grads["eager"][name], torch.float32)


# ---------------------------------------------------------------------------
# what the test set-up relies on, and what is refused
# ---------------------------------------------------------------------------
def test_gemma2_reference_is_eager():
    """The float64 reference restates Gemma 2's eager attention: in float32
    (where eager's float32 softmax is the inputs' dtype) the logits are eager's."""
    spec = MODELS["gemma2"]
    eager = models("gemma2")["eager", torch.float32]
    mine = AutoModelForCausalLM.from_config(spec.config(), attn_implementation=REF64)
    mine.load_state_dict(eager.state_dict())
    mine = mine.to(DEVICE).eval()
    ids = token_ids(2, 13, vocab=VOCAB, seed=_seed("gemma2", "reference"))
    mask = left_padding(2, 13)
    with torch.no_grad():
        for kw in ({}, {"attention_mask": mask}):
            assert torch.equal(mine(ids, **kw).logits, eager(ids, **kw).logits)


def test_gemma2_softcap_matters():
    """Without the cap Gemma 2's logits move far beyond the tolerance: the
    comparisons above see it."""
    eager = models("gemma2")["eager", torch.float32]
    config = MODELS["gemma2"].config()
    config.attn_logit_softcapping = None
    uncapped = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    assert all(layer.self_attn.attn_logit_softcapping is None for layer in uncapped.model.layers)
    uncapped.load_state_dict(eager.state_dict())
    uncapped = uncapped.to(DEVICE).eval()
    ids = token_ids(2, 21, vocab=VOCAB, seed=_seed("gemma2", "logits"))
    with torch.no_grad():
        assert (uncapped(ids).logits - eager(ids).logits).abs().max() > 1e-2


@pytest.mark.parametrize("cap", [0.0, -5.0, float("nan"), float("inf")], ids=["zero", "negative", "nan", "inf"])
def test_bad_softcap_raises(cap):
    """Eager divides by the cap: 0 is not "no cap" there, so it is refused, not read as tileattn's off."""
    q = torch.randn(1, 2, 4, 8)
    module = torch.nn.Module()
    module.is_causal = True
    with pytest.raises(ValueError, match="softcap"):
        hf.tileattn_attention_forward(module, q, q, q, None, softcap=cap)


def test_softcap_with_dropout_raises():
    """Attention dropout in training mode with a softcap: neither tileattn nor
    torch's SDPA computes it; refused (the model's attention_dropout is 0 by default)."""
    q = torch.randn(1, 2, 4, 8)
    module = torch.nn.Module()
    module.is_causal = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TileattnFallbackWarning)
        with pytest.raises(ValueError, match="dropout together with softcap"):
            hf.tileattn_attention_forward(module, q, q, q, None, dropout=0.1, softcap=5.0)
