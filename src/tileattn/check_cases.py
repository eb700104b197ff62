"""The entries of ``tileattn check`` (the contract: ``tileattn.check``).

An entry's ``run(dtype, device, gen)`` builds fresh random inputs from
``gen``, calls one function of the library and returns ``(shape text,
pairs)``: one ``(name, got, ref64, lowp)`` pair per output or gradient, with
the float64 reference and the same reference in ``dtype``, which the runner
holds to the accuracy rule.  It raises :class:`Skip` when it cannot run here
(the reason is reported).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

PATHS = ("kernels", "torch")


class Skip(Exception):
    """An entry that cannot run on this machine; the message says why."""


def _grads(loss, inputs):
    return torch.autograd.grad(loss, inputs)


def _randn(shape, dtype, device, gen, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(device=device, dtype=dtype)


def _leaf(t):
    return t.detach().requires_grad_()


def _fwd_bwd_pairs(fn, ref_fn, tensors, do, dtype, names=("out", "dq", "dk", "dv")):
    """Run fn and ref_fn (the standard reference, in dtype and in float64) on the
    same inputs; return the (name, got, ref64, lowp) pairs of out and the
    gradients of ``tensors`` (``names``: out's, then one per tensor)."""
    ins = [_leaf(t) for t in tensors]
    out = fn(*ins)
    got = (out,) + _grads((out * do).sum(), ins)
    low_in = [_leaf(t) for t in tensors]
    low_out = ref_fn(*low_in)
    low = (low_out,) + _grads((low_out * do).sum(), low_in)
    ref_in = [_leaf(t.double()) for t in tensors]
    ref_out = ref_fn(*ref_in)
    ref = (ref_out,) + _grads((ref_out * do.double()).sum(), ref_in)
    return list(zip(names, got, ref, low))


def _dims(d, dv):
    return f"D{d}" + ("" if dv == d else f" Dv{dv}")


def _dense_shape(b, hq, hkv, nq, nk, d, dv, causal):
    return f"B{b} H{hq}:{hkv} {nq}x{nk} {_dims(d, dv)}{' causal' if causal else ''}"


def _qkv_do(b, hq, hkv, nq, nk, d, dv, dtype, device, gen):
    """q (b, hq, nq, d), k (b, hkv, nk, d), v (b, hkv, nk, dv) and the output's gradient."""
    q = _randn((b, hq, nq, d), dtype, device, gen)
    k = _randn((b, hkv, nk, d), dtype, device, gen)
    v = _randn((b, hkv, nk, dv), dtype, device, gen)
    do = _randn((b, hq, nq, dv), dtype, device, gen)
    return q, k, v, do


def _fits_or_skip(q, k, v, plain):
    """Skip where the kernels have no tile of this head dim that fits the
    GPU's shared memory for a forward and backward (float32 at 512 on a
    99 KB part): there ``attention`` raises ValueError before any launch, by
    design, and the check says so instead of failing."""
    from .api import check_shared_memory
    from .dispatch import default_deterministic
    q = _leaf(q)
    try:
        check_shared_memory(q, k, v, None, default_deterministic(q, k, v, plain))
    except ValueError as exc:
        raise Skip(f"attention refuses it here (ValueError): {exc}") from None


# ---------------------------------------------------------------------------
# the library's functions
# ---------------------------------------------------------------------------
def _dense_check(b, hq, hkv, nq, nk, d, causal, dv=None, **variant):
    """``attention`` forward and backward; ``dv``: V's head dim (default d)."""
    dv = d if dv is None else dv

    def run(dtype, device, gen):
        import tileattn
        from .reference import standard_attention
        kw = dict(variant)
        if kw.get("alibi_slopes") == "make":
            kw["alibi_slopes"] = torch.rand(hq, generator=gen).to(device) * 0.5 + 0.05
        if kw.get("block_mask") == "make":
            kw["block_mask"] = tileattn.block_mask_from_fn(
                lambda bb, h, i, j: (j <= i) | (j >= nk - 40), None, None, nq, nk, device=device).mask
        q, k, v, do = _qkv_do(b, hq, hkv, nq, nk, d, dv, dtype, device, gen)
        _fits_or_skip(q, k, v, plain=not kw)
        pairs = _fwd_bwd_pairs(lambda q, k, v: tileattn.attention(q, k, v, causal=causal, **kw),
                               lambda q, k, v: standard_attention(q, k, v, causal=causal, **kw),
                               (q, k, v), do, dtype)
        return _dense_shape(b, hq, hkv, nq, nk, d, dv, causal), pairs
    return run


def _sinks_check(b, hq, hkv, nq, nk, d, causal, dv=None):
    """Attention sinks: out and the gradients of q, k, v and the sinks; ``dv``:
    V's head dim (default d)."""
    dv = d if dv is None else dv

    def run(dtype, device, gen):
        import tileattn
        from .reference import standard_attention
        q, k, v, do = _qkv_do(b, hq, hkv, nq, nk, d, dv, dtype, device, gen)
        sinks = _randn((hq,), torch.float32, device, gen, scale=2.0)
        pairs = _fwd_bwd_pairs(lambda q, k, v, s: tileattn.attention(q, k, v, causal=causal, sinks=s),
                               lambda q, k, v, s: standard_attention(q, k, v, causal=causal, sinks=s),
                               (q, k, v, sinks), do, dtype, names=("out", "dq", "dk", "dv", "dsinks"))
        return _dense_shape(b, hq, hkv, nq, nk, d, dv, causal), pairs
    return run


def _varlen_check(lengths, hq, hkv, d, causal, dv=None, sinks=False):
    """``attention_varlen`` forward and backward; ``dv``: V's head dim (default
    d); ``sinks``: with attention sinks (and their gradient)."""
    dv = d if dv is None else dv

    def run(dtype, device, gen):
        import tileattn
        from .reference import standard_attention_varlen
        cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device=device)
        total, longest = sum(lengths), max(lengths)
        q = _randn((total, hq, d), dtype, device, gen)
        k = _randn((total, hkv, d), dtype, device, gen)
        v = _randn((total, hkv, dv), dtype, device, gen)
        do = _randn((total, hq, dv), dtype, device, gen)
        extra = (_randn((hq,), torch.float32, device, gen, scale=2.0),) if sinks else ()
        pairs = _fwd_bwd_pairs(
            lambda q, k, v, *s: tileattn.attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal,
                                                          sinks=s[0] if s else None),
            lambda q, k, v, *s: standard_attention_varlen(q, k, v, cu, cu, causal=causal, sinks=s[0] if s else None),
            (q, k, v) + extra, do, dtype, names=("out", "dq", "dk", "dv", "dsinks")[:4 + len(extra)])
        return f"{'+'.join(map(str, lengths))} H{hq}:{hkv} {_dims(d, dv)}{' causal' if causal else ''}", pairs
    return run


def _kvcache_check(seqlens, n_new, hq, hkv, d, capacity, dv=None, shared=False, sinks=False, num_splits=0):
    """``attention_with_kvcache`` after appending ``n_new`` tokens to each
    sequence; ``dv``: V's head dim (default d); ``shared``: v_cache is
    k_cache[..., :dv] (the absorbed MLA layout: each key's first dv channels
    are its value, and only k_new is appended); ``sinks``: with attention
    sinks (counted once whatever ``num_splits``)."""
    dv = d if dv is None else dv

    def run(dtype, device, gen):
        import tileattn
        from .reference import standard_attention
        b = len(seqlens)
        q = _randn((b, hq, n_new, d), dtype, device, gen)
        k_cache = _randn((b, hkv, capacity, d), dtype, device, gen)
        v_cache = k_cache[..., :dv] if shared else _randn((b, hkv, capacity, dv), dtype, device, gen)
        k_new = _randn((b, hkv, n_new, d), dtype, device, gen)
        v_new = None if shared else _randn((b, hkv, n_new, dv), dtype, device, gen)
        lens = torch.tensor(seqlens, dtype=torch.int32, device=device)
        s = _randn((hq,), torch.float32, device, gen, scale=2.0) if sinks else None
        with torch.no_grad():
            out = tileattn.attention_with_kvcache(q, k_cache, v_cache, lens, k_new=k_new, v_new=v_new, causal=True,
                                                  sinks=s, num_splits=num_splits)
        pairs = []
        for i, n in enumerate(seqlens):  # the reference: each sequence after the append, bottom-right causal
            kk = torch.cat((k_cache[i:i + 1, :, :n], k_new[i:i + 1]), dim=2)
            vv = kk[..., :dv] if shared else torch.cat((v_cache[i:i + 1, :, :n], v_new[i:i + 1]), dim=2)
            low = standard_attention(q[i:i + 1], kk, vv, causal=True, sinks=s)
            ref = standard_attention(q[i:i + 1].double(), kk.double(), vv.double(), causal=True,
                                     sinks=None if s is None else s.double())
            pairs.append((f"out[{i}]", out[i:i + 1], ref, low))
        layout = f" v = k[..., :{dv}]" if shared else ""
        splits = f" {num_splits} splits" if num_splits else ""
        return f"cache {'/'.join(map(str, seqlens))}+{n_new} H{hq}:{hkv} {_dims(d, dv)}{layout}{splits}", pairs
    return run


def _sdpa_check(b, hq, hkv, nq, nk, d):
    def run(dtype, device, gen):
        import tileattn
        from .sdpa import _torch_sdpa

        def ours(q, k, v):
            return tileattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv)

        def theirs(q, k, v):
            return _torch_sdpa(q, k, v, is_causal=True, enable_gqa=hq != hkv)

        q, k, v, do = _qkv_do(b, hq, hkv, nq, nk, d, d, dtype, device, gen)
        pairs = _fwd_bwd_pairs(ours, theirs, (q, k, v), do, dtype)
        return _dense_shape(b, hq, hkv, nq, nk, d, d, True), pairs
    return run


# ---------------------------------------------------------------------------
# tiny transformers models with attn_implementation="tileattn"
# ---------------------------------------------------------------------------
def _llama_config():
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64), {}, "sdpa"


def _gpt_oss_config():
    """Sinks (s_aux) and alternating sliding-window / full layers; experts on
    the eager implementation so that the float64 reference runs."""
    import transformers
    if int(transformers.__version__.split(".")[0]) < 5:   # the experts_implementation switch is 5.x's
        raise ImportError("the gpt-oss check needs transformers >= 5")
    from transformers import GptOssConfig
    cfg = GptOssConfig(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=2,
                       num_experts_per_tok=1, sliding_window=5, layer_types=["sliding_attention", "full_attention"],
                       max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    # gpt-oss's eager attention computes in the inputs' dtype: the float64 reference
    return cfg, {"experts_implementation": "eager"}, "eager"


def _deepseek_v3_config():
    """Multi-head latent attention: q and k at qk_nope + qk_rope = 96, v at 64
    (a V head dim below the Q/K one); a yarn mscale in the scale; a small MoE
    on the eager experts."""
    import transformers
    if int(transformers.__version__.split(".")[0]) < 5:   # the experts_implementation switch is 5.x's
        raise ImportError("the DeepSeek-V3 check needs transformers >= 5")
    from transformers import DeepseekV3Config
    cfg = DeepseekV3Config(vocab_size=97, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48,
                           kv_lora_rank=32, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
                           n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
                           first_k_dense_replace=1, max_position_embeddings=64,
                           rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                            "original_max_position_embeddings": 16, "mscale": 1.0,
                                            "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1})
    return cfg, {"experts_implementation": "eager"}, "sdpa"


def _gemma2_config():
    """Head dim 256, attention logit softcapping, sliding-window layers
    alternating with global ones, query_pre_attn_scalar != head dim."""
    from transformers import Gemma2Config
    cfg = Gemma2Config(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=64,
                       sliding_window=5, attn_logit_softcapping=5.0, max_position_embeddings=64)
    # Gemma 2 has no "sdpa" (SDPA has no softcap); its eager attention in float64
    # runs the softmax in float32, a rounding far below the rule's floor here
    return cfg, {}, "eager"


def _gemma4_config():
    """Head dim 256 on the sliding layers, 512 on the global ones (Gemma 4)."""
    from transformers import Gemma4TextConfig
    cfg = Gemma4TextConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=256, global_head_dim=512,
                           sliding_window=5, layer_types=["sliding_attention", "full_attention"],
                           hidden_size_per_layer_input=16, vocab_size_per_layer_input=97, max_position_embeddings=64)
    return cfg, {}, "sdpa"


def _transformers_check(make_config):
    def run(dtype, device, gen):
        try:
            import transformers
            from transformers import AutoModelForCausalLM
            make_config()
        except (ImportError, AttributeError):
            raise Skip("transformers (with this model) is not installed (pip install 'tileattn[hf]')") from None
        import tileattn
        tileattn.register_transformers()
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        cfg, extra, ref_impl = make_config()
        state = AutoModelForCausalLM.from_config(cfg, **extra).state_dict()

        def logits(impl, dt, ids):
            m = AutoModelForCausalLM.from_config(make_config()[0], attn_implementation=impl, **extra)  # a config each
            m.load_state_dict(state)
            m = m.to(device=device, dtype=dt).eval()
            with torch.no_grad():
                return m(ids).logits

        ids = torch.randint(0, 97, (2, 24), generator=gen).to(device)
        pairs = [("logits", logits("tileattn", dtype, ids), logits(ref_impl, torch.float64, ids),
                  logits("eager", dtype, ids))]
        return f"2x24 tokens, v{transformers.__version__}", pairs
    return run


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    run: Callable
    paths: tuple = PATHS
    interpreter: bool = True   # small enough for the Triton interpreter


CHECKS = (
    Check("attention", _dense_check(2, 4, 2, 40, 72, 32, causal=True)),
    Check("attention", _dense_check(1, 2, 2, 67, 33, 64, causal=False)),
    Check("attention window", _dense_check(1, 2, 1, 48, 64, 32, causal=True, window=(16, 0))),
    Check("attention softcap", _dense_check(1, 2, 2, 33, 49, 32, causal=False, softcap=5.0)),
    Check("attention alibi", _dense_check(1, 4, 2, 40, 40, 32, causal=True, alibi_slopes="make")),
    Check("attention blocks", _dense_check(1, 2, 2, 160, 300, 32, causal=False, block_mask="make"),
          interpreter=False),
    Check("attention sinks", _sinks_check(1, 4, 2, 70, 30, 32, causal=True)),
    Check("attention sinks head dim v", _sinks_check(1, 4, 1, 45, 45, 64, causal=False, dv=40)),
    # DeepSeek's MLA training and prefill: V narrower than Q/K (its head dims)
    Check("attention head dim v", _dense_check(1, 4, 2, 40, 56, 192, causal=True, dv=128)),
    # the widest training head dim (float32 only where its tiles fit the GPU's shared memory)
    Check("attention head dim 512", _dense_check(1, 2, 1, 33, 70, 512, causal=True)),
    Check("attention head dim 512 v", _dense_check(1, 2, 1, 35, 20, 128, causal=False, dv=512)),
    Check("varlen", _varlen_check((17, 1, 40, 0, 23), 4, 2, 32, causal=True)),
    Check("varlen head dim v", _varlen_check((9, 0, 30), 4, 2, 32, causal=True, dv=48)),  # V wider, padded
    Check("varlen sinks", _varlen_check((12, 0, 25), 4, 2, 32, causal=True, sinks=True)),
    Check("kvcache", _kvcache_check((0, 13, 70), 3, 4, 2, 32, capacity=96)),
    Check("kvcache head dim v", _kvcache_check((13, 40), 2, 4, 2, 64, capacity=48, dv=32)),
    # the split combine must count each row's sink once (an empty cache's row: lse = its sink)
    Check("kvcache sinks", _kvcache_check((0, 29, 60), 1, 4, 2, 32, capacity=64, sinks=True, num_splits=3)),
    # DeepSeek-V3's absorbed MLA decoding: one kv head, D = 576, V the keys' first 512 channels
    Check("kvcache absorbed mla", _kvcache_check((0, 37, 70), 1, 16, 1, 576, capacity=80, dv=512, shared=True)),
    Check("sdpa drop-in", _sdpa_check(1, 4, 2, 50, 20, 32)),
    Check("transformers llama", _transformers_check(_llama_config), paths=("auto",), interpreter=False),
    Check("transformers gpt-oss", _transformers_check(_gpt_oss_config), paths=("auto",), interpreter=False),
    Check("transformers deepseek-v3", _transformers_check(_deepseek_v3_config), paths=("auto",),
          interpreter=False),
    Check("transformers gemma2", _transformers_check(_gemma2_config), paths=("auto",), interpreter=False),
    Check("transformers gemma4", _transformers_check(_gemma4_config), paths=("auto",), interpreter=False),
)
