"""gpt-oss under ``attn_implementation="tileattn"``: attention sinks (``s_aux``)
and alternating sliding-window / full layers.

A tiny randomly initialised gpt-oss config (no downloads; experts on
transformers' eager implementation so that float64 runs).  The float64
reference is transformers' ``"eager"`` gpt-oss attention in float64 (it
computes its softmax, sink column included, in the inputs' dtype); the
low-precision baseline is ``"eager"`` in float32.  Checked: logits and the
gradient of every parameter (the sinks included) under the accuracy rule,
greedy ``generate()`` token for token, that the sliding layers run
tileattn's window and every layer passes its sinks, and the padded
(explicit-mask) fallback.
"""
import warnings
import zlib

import pytest
import torch

import tileattn
from tileattn.sdpa import TileattnFallbackWarning
from tileattn.testing import check_accuracy, token_ids

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip("needs transformers >= 5 (gpt-oss with switchable experts)", allow_module_level=True)
from transformers import AutoModelForCausalLM, GptOssConfig  # noqa: E402

from tileattn.integrations import transformers as hf  # noqa: E402

from conftest import DEVICE, SEED_OFFSET  # noqa: E402

VOCAB = 97
WINDOW = 5


def _config():
    return GptOssConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=2,
                        num_experts_per_tok=1, sliding_window=WINDOW,
                        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=64,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                        bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _seed(*parts) -> int:
    return zlib.crc32("-".join(map(str, parts)).encode()) + SEED_OFFSET


@pytest.fixture(scope="module")
def models():
    tileattn.register_transformers()
    torch.manual_seed(_seed("gpt-oss", "weights"))
    state = AutoModelForCausalLM.from_config(_config(), experts_implementation="eager").state_dict()
    with torch.no_grad():   # sinks of both signs and sizes (the init is small)
        for name, value in state.items():
            if name.endswith("sinks"):
                value.copy_(torch.linspace(-3.0, 3.0, value.numel()))
    out = {}
    for impl, dtype in (("eager", torch.float64), ("eager", torch.float32), ("tileattn", torch.float32)):
        m = AutoModelForCausalLM.from_config(_config(), attn_implementation=impl, experts_implementation="eager")
        m.load_state_dict(state)
        out[impl, dtype] = m.to(device=DEVICE, dtype=dtype).eval()
    return out


@pytest.fixture
def attention_calls(monkeypatch):
    """(q shape, k shape, window, with sinks) of every tileattn.attention call."""
    calls = []
    real = hf.api.attention

    def spy(q, k, v, **kw):
        calls.append((tuple(q.shape), tuple(k.shape), kw.get("window"), kw.get("sinks") is not None))
        return real(q, k, v, **kw)
    monkeypatch.setattr(hf.api, "attention", spy)
    return calls


def _logits(models, ids, **kw):
    """(tileattn float32, eager float64, eager float32) logits."""
    with torch.no_grad():
        return tuple(models[key](ids, **kw).logits for key in
                     (("tileattn", torch.float32), ("eager", torch.float64), ("eager", torch.float32)))


def test_logits_match_eager(models, attention_calls):
    ids = token_ids(2, 21, vocab=VOCAB, seed=_seed("logits"))
    check_accuracy("gpt-oss logits", *_logits(models, ids), torch.float32)
    # layer 0 slides (window W: keys i - W < j <= i), layer 1 attends to all; both with their sinks
    assert ((2, 4, 21, 16), (2, 2, 21, 16), (WINDOW - 1, 0), True) in attention_calls
    assert ((2, 4, 21, 16), (2, 2, 21, 16), None, True) in attention_calls


def test_logits_on_kernels(models, kernels, attention_calls):
    ids = token_ids(1, 19, vocab=VOCAB, seed=_seed("kernels"))
    check_accuracy("gpt-oss logits (kernels)", *_logits(models, ids), torch.float32)
    assert attention_calls


def test_padded_batch_falls_back_with_sinks(models):
    ids = token_ids(2, 13, vocab=VOCAB, seed=_seed("pad"))
    mask = torch.ones(2, 13, dtype=torch.long, device=DEVICE)
    mask[0, :4] = 0
    tileattn.sdpa.reset_fallback_warnings()
    with pytest.warns(TileattnFallbackWarning, match="explicit mask"):
        got, ref, low = _logits(models, ids, attention_mask=mask)
    keep = mask.bool()
    check_accuracy("gpt-oss padded logits", got[keep], ref[keep], low[keep], torch.float32)


def test_generate_greedy_identical(models, attention_calls):
    ids = token_ids(2, 8, vocab=VOCAB, seed=_seed("generate"))
    kw = dict(max_new_tokens=10, do_sample=False, pad_token_id=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TileattnFallbackWarning)
        got = models["tileattn", torch.float32].generate(ids, **kw)
    want = models["eager", torch.float32].generate(ids, **kw)
    assert torch.equal(got, want)
    assert any(q[2] == 1 for q, *_ in attention_calls), "decoding steps did not run on tileattn"


def test_gradients_match_eager_sinks_included(models, attention_calls):
    ids = token_ids(2, 16, vocab=VOCAB, seed=_seed("backward"))
    grads = {}
    for key in (("tileattn", torch.float32), ("eager", torch.float32), ("eager", torch.float64)):
        m = models[key].train()
        m.zero_grad(set_to_none=True)
        m(ids, labels=ids).loss.backward()
        grads[key] = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
        m.eval()
    assert attention_calls
    names = grads["eager", torch.float64].keys()
    assert grads["tileattn", torch.float32].keys() == names
    assert any(n.endswith("sinks") for n in names)
    for name in names:
        check_accuracy(f"gpt-oss grad {name}", grads["tileattn", torch.float32][name],
                       grads["eager", torch.float64][name], grads["eager", torch.float32][name], torch.float32)


@pytest.mark.parametrize("case", ["sliding-plain", "sliding-other-width", "sliding-padded"])
def test_mask_builder_sliding_window(case):
    """The plain sliding-window causal mask is tileattn's window (None: no mask
    built); another pattern under the same ``local_size``, or padding, gets
    the materialised mask."""
    from transformers.masking_utils import sliding_window_causal_mask_function
    width = {"sliding-other-width": WINDOW + 2}.get(case, WINDOW)
    padding = None
    if case == "sliding-padded":
        padding = torch.tensor([[False] * 3 + [True] * 7, [True] * 10])
    kw = dict(batch_size=2, kv_length=10, kv_offset=0, mask_function=sliding_window_causal_mask_function(width),
              attention_mask=padding, allow_is_causal_skip=True, local_size=WINDOW, dtype=torch.float32,
              device="cpu")
    if int(transformers.__version__.split(".")[0]) < 5:
        kw["cache_position"] = torch.arange(6, 10)
    else:
        kw.update(q_length=4, q_offset=6)
    mask = hf.tileattn_attention_mask(**kw)
    if case == "sliding-plain":
        assert mask is None
    else:
        assert mask is not None and mask.dtype == torch.bool
