"""``attn_implementation="tileattn"`` in Hugging Face transformers.

Tiny randomly initialised Llama- (GQA 4:2), Qwen2- (GQA 4:1, qkv bias) and
GPT-2-style (multi-head, learned positions) models built from configs, no
downloads.  Each is compared with the same weights under transformers' other
implementations: logits and gradients under the accuracy rule, greedy
``generate()`` token for token against ``"eager"``, left-padded batches, and a
KV cache with Nq != Nk.

The float64 reference is transformers' ``"sdpa"`` implementation in float64
(torch's math kernel): ``"eager"`` is not a float64 computation -- Llama and
Qwen2 run its softmax in float32, and with padding in float64 its mask value
(the float64 minimum) overflows to -inf there and turns padded rows into NaN.
The low-precision baseline of the rule is ``"eager"`` in float32; in float64
tileattn is held to the floor of the rule alone.
"""
import contextlib
import os
import subprocess
import sys
import warnings
import zlib

import pytest
import torch

import tileattn
from tileattn.sdpa import TileattnFallbackWarning
from tileattn.testing import check_accuracy, left_padding, token_ids

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, DynamicCache, GPT2Config, LlamaConfig, Qwen2Config  # noqa: E402

from tileattn.integrations import transformers as hf  # noqa: E402

from conftest import DEVICE, SEED_OFFSET  # noqa: E402

VOCAB = 97
DT = {torch.float32: "fp32", torch.float64: "fp64"}

CONFIGS = {
    "llama": lambda **kw: LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0, **kw),
    "qwen2": lambda **kw: Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0, **kw),
    "gpt2": lambda **kw: GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                    bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                    **{"attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0, **kw}),
}
ARCHS = sorted(CONFIGS)


@pytest.fixture(scope="module", autouse=True)
def _registered():
    assert tileattn.register_transformers() == "tileattn"


def _seed(*parts) -> int:
    return zlib.crc32("-".join(map(str, parts)).encode()) + SEED_OFFSET


def models(arch: str, **config_kw) -> dict:
    """The same random weights as sdpa float64 (reference), eager float32
    (baseline) and tileattn in float32 and float64, on DEVICE (the GPU where
    there is one: tileattn then runs its kernels)."""
    torch.manual_seed(_seed(arch, "weights"))
    state = AutoModelForCausalLM.from_config(CONFIGS[arch](**config_kw)).state_dict()
    out = {}
    for impl, dtype in (("sdpa", torch.float64), ("eager", torch.float32), ("tileattn", torch.float32),
                        ("tileattn", torch.float64)):
        # a config object each: transformers records the implementation on it
        m = AutoModelForCausalLM.from_config(CONFIGS[arch](**config_kw), attn_implementation=impl)
        m.load_state_dict(state)
        out[impl, dtype] = m.to(device=DEVICE, dtype=dtype).eval()
    for (impl, _), m in out.items():
        assert m.config._attn_implementation == impl
    return out


def _path_for(dtype):
    """float64 runs the PyTorch path (the kernels take fp16/bf16/fp32 on a GPU)."""
    return tileattn.use_backend("torch") if dtype == torch.float64 else contextlib.nullcontext()


@pytest.fixture
def attention_calls(monkeypatch):
    """(q shape, k shape, causal) of every tileattn.attention call."""
    calls = []
    real = hf.api.attention

    def spy(q, k, v, **kw):
        calls.append((tuple(q.shape), tuple(k.shape), kw.get("causal")))
        return real(q, k, v, **kw)

    monkeypatch.setattr(hf.api, "attention", spy)
    return calls


def _check_logits(name, ms, fwd, dtype, select=None):
    """fwd(model) -> logits, compared under the accuracy rule."""
    with torch.no_grad():
        with _path_for(dtype):
            got = fwd(ms["tileattn", dtype])
        ref = fwd(ms["sdpa", torch.float64])
        low = fwd(ms["eager", dtype]) if dtype != torch.float64 else ref
    if select is not None:
        got, ref, low = got[select], ref[select], low[select]
    check_accuracy(name, got, ref, low, dtype)


# ---------------------------------------------------------------------------
# logits
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=DT.get)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_eager(arch, dtype, attention_calls):
    ms = models(arch)
    ids = token_ids(2, 21, vocab=VOCAB, seed=_seed(arch, "ids", dtype))
    _check_logits(f"{arch} logits", ms, lambda m: m(ids).logits, dtype)
    assert attention_calls and all(c[2] is True for c in attention_calls)  # tileattn ran, causal


def test_logits_match_eager_on_kernels(kernels, attention_calls):
    """The same through the Triton kernels (the interpreter here; the GPU path on CUDA)."""
    ms = models("llama")
    ids = token_ids(2, 19, vocab=VOCAB, seed=_seed("kernels", "ids"))
    _check_logits("llama logits (kernels)", ms, lambda m: m(ids).logits, torch.float32)
    assert attention_calls


@pytest.mark.parametrize("arch", ARCHS)
def test_left_padded_batch(arch):
    """Padding runs torch's SDPA with the padding mask (warned once); logits of real tokens match."""
    ms = models(arch)
    ids = token_ids(3, 17, vocab=VOCAB, seed=_seed(arch, "pad"))
    mask = left_padding(3, 17)
    tileattn.sdpa.reset_fallback_warnings()
    with pytest.warns(TileattnFallbackWarning, match="explicit mask"):
        _check_logits(f"{arch} padded logits", ms, lambda m: m(ids, attention_mask=mask).logits, torch.float32,
                      select=mask.bool())


@pytest.mark.parametrize("arch", ARCHS)
def test_kv_cache_chunk(arch, attention_calls):
    """A chunk of 6 tokens after a cached prefix of 9: Nq = 6, Nk = 15, queries at the
    end of the keys (bottom-right causal) -- on tileattn, no mask."""
    ms = models(arch)
    ids = token_ids(2, 15, vocab=VOCAB, seed=_seed(arch, "chunk"))

    def chunked(m):
        cache = DynamicCache(config=m.config)
        m(ids[:, :9], past_key_values=cache, use_cache=True)
        return m(ids[:, 9:], past_key_values=cache, use_cache=True).logits

    _check_logits(f"{arch} chunk logits", ms, chunked, torch.float32)
    assert any(q[2] == 6 and k[2] == 15 and causal for q, k, causal in attention_calls)


# ---------------------------------------------------------------------------
# generation
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["unpadded", "left-padded", "static-cache"])
@pytest.mark.parametrize("arch", ARCHS)
def test_generate_greedy_identical(arch, mode, attention_calls):
    ms = models(arch)
    ids = token_ids(3, 8, vocab=VOCAB, seed=_seed(arch, "gen", mode))
    kw = dict(max_new_tokens=10, do_sample=False, pad_token_id=0)
    if mode == "left-padded":
        kw["attention_mask"] = left_padding(3, 8, pads=(3, 0, 1))
    if mode == "static-cache":  # unfilled cache slots: an explicit mask, torch's SDPA
        kw["cache_implementation"] = "static"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TileattnFallbackWarning)
        got = ms["tileattn", torch.float32].generate(ids, **kw)
    want = ms["eager", torch.float32].generate(ids, **kw)
    assert torch.equal(got, want)
    if mode == "unpadded":  # prefill (8 x 8) and decoding (1 x n) both ran on tileattn
        assert any(q[2] == 8 for q, _, _ in attention_calls)
        assert any(q[2] == 1 and k[2] > 8 for q, k, _ in attention_calls)


# ---------------------------------------------------------------------------
# backward
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_backward_matches_eager(arch, attention_calls):
    ms = models(arch)
    ids = token_ids(2, 16, vocab=VOCAB, seed=_seed(arch, "bwd"))
    grads = {}
    for key in (("tileattn", torch.float32), ("eager", torch.float32), ("sdpa", torch.float64)):
        m = ms[key].train()
        m.zero_grad(set_to_none=True)
        m(ids, labels=ids).loss.backward()
        grads[key] = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
    assert attention_calls
    assert grads["tileattn", torch.float32].keys() == grads["sdpa", torch.float64].keys()
    for name, got in grads["tileattn", torch.float32].items():
        check_accuracy(f"{arch} grad {name}", got, grads["sdpa", torch.float64][name],
                       grads["eager", torch.float32][name], torch.float32)


def test_training_dropout_runs_torch_sdpa():
    """Attention dropout in training mode: torch's SDPA runs (warned once), with the
    same random numbers as transformers' own "sdpa" implementation."""
    torch.manual_seed(_seed("dropout"))
    ref = AutoModelForCausalLM.from_config(CONFIGS["gpt2"](attn_pdrop=0.5), attn_implementation="sdpa")
    mine = AutoModelForCausalLM.from_config(CONFIGS["gpt2"](attn_pdrop=0.5), attn_implementation="tileattn")
    mine.load_state_dict(ref.state_dict())
    ref, mine = ref.to(DEVICE).train(), mine.to(DEVICE).train()
    assert (ref.config._attn_implementation, mine.config._attn_implementation) == ("sdpa", "tileattn")
    ids = token_ids(2, 12, vocab=VOCAB, seed=_seed("dropout", "ids"))
    tileattn.sdpa.reset_fallback_warnings()
    torch.manual_seed(1)
    with pytest.warns(TileattnFallbackWarning, match="dropout"):
        got = mine(ids).logits
    torch.manual_seed(1)
    want = ref(ids).logits
    torch.testing.assert_close(got, want)


def test_output_attentions_warns_once():
    """output_attentions=True: the weights are never formed, so none come
    back, and a warning (once a process) says so and what to load instead."""
    torch.manual_seed(_seed("attentions"))
    model = AutoModelForCausalLM.from_config(CONFIGS["llama"](), attn_implementation="tileattn").to(DEVICE).eval()
    ids = token_ids(1, 7, vocab=VOCAB, seed=_seed("attentions", "ids"))
    hf._warned_attentions = False
    with torch.no_grad(), pytest.warns(UserWarning, match="output_attentions=True returns no weights"):
        out = model(ids, output_attentions=True)
    assert not any(a is not None for a in (out.attentions or ()))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", UserWarning)
        model(ids, output_attentions=True)   # told once


def test_bidirectional_fallback_names_its_reason():
    """A non-causal (bidirectional) call with transformers' explicit mask
    falls back with that reason, not the padding one."""
    class Module:
        is_causal = False
    q = torch.randn(1, 2, 5, 8, device=DEVICE)
    mask = torch.ones(1, 1, 5, 5, dtype=torch.bool, device=DEVICE)
    tileattn.sdpa.reset_fallback_warnings()
    with pytest.warns(TileattnFallbackWarning, match="non-causal"):
        out, _ = hf.tileattn_attention_forward(Module(), q, q, q, mask, scaling=0.3)
    torch.testing.assert_close(out.transpose(1, 2), torch.nn.functional.scaled_dot_product_attention(q, q, q, scale=0.3))


# ---------------------------------------------------------------------------
# the mask builder and registration
# ---------------------------------------------------------------------------
def _mask_kwargs(**kw):
    from transformers.masking_utils import causal_mask_function
    base = dict(batch_size=2, q_length=4, kv_length=10, q_offset=6, kv_offset=0, mask_function=causal_mask_function,
                attention_mask=None, allow_is_causal_skip=True, dtype=torch.float32, device="cpu")
    out = {**base, **kw}
    if int(transformers.__version__.split(".")[0]) < 5:  # 4.5x passes the query positions instead
        start = out.pop("q_offset")
        out["cache_position"] = torch.arange(start, start + out.pop("q_length"))
    return out


MASK_CASES = {
    "decode-chunk": (dict(), None),
    "prefill": (dict(q_length=10, q_offset=0), None),
    "all-ones-padding": (dict(attention_mask=torch.ones(2, 10, dtype=torch.bool)), None),
    "static-cache-prefill": (dict(q_length=4, q_offset=0), "top-left"),
    "padding": (dict(attention_mask=torch.tensor([[False] * 3 + [True] * 7, [True] * 10])), "padded"),
    "skip-not-allowed": (dict(allow_is_causal_skip=False), "bottom-right"),
    "sliding-window": (dict(local_size=3), "bottom-right"),
}


@pytest.mark.parametrize("name", sorted(MASK_CASES))
def test_mask_builder(name):
    """None exactly for tileattn's bottom-right causal case, else the materialised sdpa mask."""
    kw, expect = MASK_CASES[name]
    mask = hf.tileattn_attention_mask(**_mask_kwargs(**kw))
    if expect is None:
        assert mask is None
        return
    assert mask.dtype == torch.bool and mask.shape == (2, 1, kw.get("q_length", 4), 10)
    i = torch.arange(mask.shape[2])[:, None] + kw.get("q_offset", 6)
    j = torch.arange(10)[None, :]
    want = (j <= i).expand(2, 1, -1, -1).clone()
    if expect == "padded":
        want[0, :, :, :3] = False
    assert torch.equal(mask, want)


def test_register_rejects_reserved_names():
    with pytest.raises(ValueError, match="flash"):
        tileattn.register_transformers("tileattn_flash")
    with pytest.raises(ValueError, match="reserved"):
        tileattn.register_transformers("sdpa")
    with pytest.raises(TypeError, match="name"):
        tileattn.register_transformers(None)
    assert tileattn.register_transformers() == "tileattn"  # again: harmless


def test_unsupported_kwargs_raise():
    q = torch.randn(1, 2, 4, 8)
    module = torch.nn.Module()
    module.is_causal = True
    with pytest.raises(ValueError, match="position_bias"):
        hf.tileattn_attention_forward(module, q, q, q, None, position_bias=torch.zeros(1, 2, 4, 4))


def test_importing_tileattn_does_not_import_transformers():
    code = "import sys, tileattn; assert 'transformers' not in sys.modules, 'imported'; print('ok')"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TRITON_INTERPRET": "0"})
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
