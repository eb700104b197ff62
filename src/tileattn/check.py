"""``tileattn check``: is every path of tileattn correct on this machine?

Each check runs one function of the library on fresh random inputs and holds
its outputs (and gradients, where it has a backward) to the accuracy rule of
``tileattn.testing``: the error against float64 standard attention must be
at most twice that of standard attention in the same precision, plus a tiny
floor.  Paths:

* ``kernels``: the Triton kernels -- compiled on a CUDA GPU; without one they
  run under the Triton interpreter (``TRITON_INTERPRET=1``) on small shapes.
* ``torch``: the pure-PyTorch tiled path (what CPU tensors run).

Functions: ``attention`` (plain, causal with Nq != Nk, GQA), its variants
(sliding window, softcap, ALiBi, block-sparse layouts), ``attention_varlen``,
``attention_with_kvcache``, ``scaled_dot_product_attention`` (against torch's
SDPA), attention sinks (gradients of the sinks included) and, when
transformers is installed, a tiny Llama, a tiny gpt-oss (sinks, sliding
windows), a tiny DeepSeek-V3 (a V head dim below the Q/K one) and a tiny
Gemma 2 (head dim 256, softcap, sliding windows) with
``attn_implementation="tileattn"``.

Exit codes: 0 every check passed, 1 a check failed, 2 bad arguments,
3 ``--device cuda`` without a GPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback
from typing import Callable

import torch

EXAMPLES = """examples:
  tileattn check                      # every path this machine has
  tileattn check --paths torch        # only the PyTorch tiled path
  tileattn check --json > check.json  # machine-readable; exit code 0 / 1
  tileattn check --seed 7             # other random inputs"""

PATHS = ("kernels", "torch")
_DT = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


@dataclasses.dataclass
class Result:
    check: str
    path: str
    dtype: str
    shape: str
    status: str          # "pass" | "fail" | "skip"
    error: float | None = None
    allowed: float | None = None
    seconds: float = 0.0
    detail: str = ""


class _Skip(Exception):
    pass


# ---------------------------------------------------------------------------
# the rule over several tensors
# ---------------------------------------------------------------------------
def _judge(pairs, dtype) -> tuple[bool, float, float, str]:
    """pairs: (name, got, ref64, lowp).  The worst tensor by error / allowed."""
    from .testing import FLOOR, max_error
    worst = None
    for name, got, ref, low in pairs:
        err = max_error(got, ref)
        base = max_error(low, ref)
        if base == float("inf"):
            base = 0.0
        allowed = 2.0 * base + FLOOR[dtype]
        ratio = err / allowed if allowed > 0 else float("inf")
        if worst is None or ratio > worst[0]:
            worst = (ratio, err, allowed, name)
    ratio, err, allowed, name = worst
    return ratio <= 1.0, err, allowed, name


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


# ---------------------------------------------------------------------------
# the checks: each returns (shape text, pairs)
# ---------------------------------------------------------------------------
def _dense_check(b, hq, hkv, nq, nk, d, causal, **variant):
    def run(dtype, device, gen):
        import tileattn
        from .reference import standard_attention
        kw = dict(variant)
        if kw.get("alibi_slopes") == "make":
            kw["alibi_slopes"] = torch.rand(hq, generator=gen).to(device) * 0.5 + 0.05
        if kw.get("block_mask") == "make":
            kw["block_mask"] = tileattn.block_mask_from_fn(
                lambda bb, h, i, j: (j <= i) | (j >= nk - 40), None, None, nq, nk, device=device).mask
        q = _randn((b, hq, nq, d), dtype, device, gen)
        k = _randn((b, hkv, nk, d), dtype, device, gen)
        v = _randn((b, hkv, nk, d), dtype, device, gen)
        do = _randn((b, hq, nq, d), dtype, device, gen)
        pairs = _fwd_bwd_pairs(lambda q, k, v: tileattn.attention(q, k, v, causal=causal, **kw),
                               lambda q, k, v: standard_attention(q, k, v, causal=causal, **kw),
                               (q, k, v), do, dtype)
        return f"B{b} H{hq}:{hkv} {nq}x{nk} D{d}{' causal' if causal else ''}", pairs
    return run


def _sinks_check(b, hq, hkv, nq, nk, d, causal):
    """Attention sinks: out and the gradients of q, k, v and the sinks."""
    def run(dtype, device, gen):
        import tileattn
        from .reference import standard_attention
        q = _randn((b, hq, nq, d), dtype, device, gen)
        k = _randn((b, hkv, nk, d), dtype, device, gen)
        v = _randn((b, hkv, nk, d), dtype, device, gen)
        sinks = _randn((hq,), torch.float32, device, gen, scale=2.0)
        do = _randn((b, hq, nq, d), dtype, device, gen)
        pairs = _fwd_bwd_pairs(lambda q, k, v, s: tileattn.attention(q, k, v, causal=causal, sinks=s),
                               lambda q, k, v, s: standard_attention(q, k, v, causal=causal, sinks=s),
                               (q, k, v, sinks), do, dtype, names=("out", "dq", "dk", "dv", "dsinks"))
        return f"B{b} H{hq}:{hkv} {nq}x{nk} D{d}{' causal' if causal else ''}", pairs
    return run


def _varlen_check(lengths, hq, hkv, d, causal):
    def run(dtype, device, gen):
        import tileattn
        from .reference import standard_attention_varlen
        cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device=device)
        total, longest = sum(lengths), max(lengths)
        q = _randn((total, hq, d), dtype, device, gen)
        k = _randn((total, hkv, d), dtype, device, gen)
        v = _randn((total, hkv, d), dtype, device, gen)
        do = _randn((total, hq, d), dtype, device, gen)
        pairs = _fwd_bwd_pairs(
            lambda q, k, v: tileattn.attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal),
            lambda q, k, v: standard_attention_varlen(q, k, v, cu, cu, causal=causal),
            (q, k, v), do, dtype)
        return f"{'+'.join(map(str, lengths))} H{hq}:{hkv} D{d}{' causal' if causal else ''}", pairs
    return run


def _kvcache_check(seqlens, n_new, hq, hkv, d, capacity):
    def run(dtype, device, gen):
        import tileattn
        from .reference import standard_attention
        b = len(seqlens)
        q = _randn((b, hq, n_new, d), dtype, device, gen)
        k_cache = _randn((b, hkv, capacity, d), dtype, device, gen)
        v_cache = _randn((b, hkv, capacity, d), dtype, device, gen)
        k_new = _randn((b, hkv, n_new, d), dtype, device, gen)
        v_new = _randn((b, hkv, n_new, d), dtype, device, gen)
        lens = torch.tensor(seqlens, dtype=torch.int32, device=device)
        with torch.no_grad():
            out = tileattn.attention_with_kvcache(q, k_cache, v_cache, lens, k_new=k_new, v_new=v_new, causal=True)
        pairs = []
        for i, n in enumerate(seqlens):  # the reference: each sequence after the append, bottom-right causal
            kk = torch.cat((k_cache[i:i + 1, :, :n], k_new[i:i + 1]), dim=2)
            vv = torch.cat((v_cache[i:i + 1, :, :n], v_new[i:i + 1]), dim=2)
            low = standard_attention(q[i:i + 1], kk, vv, causal=True)
            ref = standard_attention(q[i:i + 1].double(), kk.double(), vv.double(), causal=True)
            pairs.append((f"out[{i}]", out[i:i + 1], ref, low))
        return f"cache {'/'.join(map(str, seqlens))}+{n_new} H{hq}:{hkv} D{d}", pairs
    return run


def _sdpa_check(b, hq, hkv, nq, nk, d):
    def run(dtype, device, gen):
        import tileattn
        from .sdpa import _torch_sdpa

        def ours(q, k, v):
            return tileattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv)

        def theirs(q, k, v):
            return _torch_sdpa(q, k, v, is_causal=True, enable_gqa=hq != hkv)

        q = _randn((b, hq, nq, d), dtype, device, gen)
        k = _randn((b, hkv, nk, d), dtype, device, gen)
        v = _randn((b, hkv, nk, d), dtype, device, gen)
        do = _randn((b, hq, nq, d), dtype, device, gen)
        pairs = _fwd_bwd_pairs(ours, theirs, (q, k, v), do, dtype)
        return f"B{b} H{hq}:{hkv} {nq}x{nk} D{d} causal", pairs
    return run


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


def _transformers_check(make_config):
    def run(dtype, device, gen):
        try:
            import transformers
            from transformers import AutoModelForCausalLM
            make_config()
        except (ImportError, AttributeError):
            raise _Skip("transformers (with this model) is not installed (pip install 'tileattn[hf]')") from None
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
    Check("varlen", _varlen_check((17, 1, 40, 0, 23), 4, 2, 32, causal=True)),
    Check("kvcache", _kvcache_check((0, 13, 70), 3, 4, 2, 32, capacity=96)),
    Check("sdpa drop-in", _sdpa_check(1, 4, 2, 50, 20, 32)),
    Check("transformers llama", _transformers_check(_llama_config), paths=("auto",), interpreter=False),
    Check("transformers gpt-oss", _transformers_check(_gpt_oss_config), paths=("auto",), interpreter=False),
    Check("transformers deepseek-v3", _transformers_check(_deepseek_v3_config), paths=("auto",),
          interpreter=False),
    Check("transformers gemma2", _transformers_check(_gemma2_config), paths=("auto",), interpreter=False),
)


# ---------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------
def _kernels_usable(device: torch.device) -> tuple[bool, str]:
    if device.type == "cuda":
        return True, "compiled for " + torch.cuda.get_device_name(device)
    from ._env import interpreter_active
    if not interpreter_active():
        if "triton" in sys.modules:  # Triton reads the variable when it is imported
            return False, ("Triton was loaded without TRITON_INTERPRET=1, so its interpreter is off "
                           "(run `TRITON_INTERPRET=1 tileattn check`)")
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton  # noqa: F401
    except ImportError:
        return False, "Triton is not installed"
    return True, "Triton interpreter (no GPU): small shapes, fp32"


def plan(device: torch.device, paths) -> tuple[list, dict]:
    """(check, path, dtype) triples to run, and a note per path."""
    notes = {}
    dtypes = {}
    if "kernels" in paths:
        ok, note = _kernels_usable(device)
        notes["kernels"] = note
        if ok:
            dtypes["kernels"] = ((torch.float16, torch.bfloat16, torch.float32) if device.type == "cuda"
                                 else (torch.float32,))
    if "torch" in paths:
        notes["torch"] = "pure-PyTorch tiled path on " + str(device)
        dtypes["torch"] = (torch.float32, torch.float64) if device.type == "cpu" else (torch.float32,)
    runs = []
    for check in CHECKS:
        if check.paths == ("auto",):
            runs.append((check, "auto", torch.float32))
            continue
        for path in paths:
            if path not in dtypes:
                runs.append((check, path, None))  # reported as skipped
                continue
            if path == "kernels" and device.type != "cuda" and not check.interpreter:
                runs.append((check, path, None))
                continue
            for dt in dtypes[path]:
                runs.append((check, path, dt))
    return runs, notes


def run_one(check: Check, path: str, dtype, device, seed: int, notes) -> Result:
    from .dispatch import use_backend
    if dtype is None:
        why = notes.get(path, "")
        if path == "kernels" and device.type != "cuda" and not check.interpreter and "interpreter" in why:
            why = "too large for the Triton interpreter; runs on a GPU"
        return Result(check.name, path, "-", "-", "skip", detail=why)
    gen = torch.Generator().manual_seed(seed)
    backend = {"kernels": "triton", "torch": "torch", "auto": "auto"}[path]
    if path == "auto":  # the path this device's tensors take by default
        from .dispatch import uses_triton
        path = "kernels" if uses_triton(torch.empty(0, device=device)) else "torch"
    t0 = time.perf_counter()
    try:
        with use_backend(backend):
            shape, pairs = check.run(dtype, device, gen)
        ok, err, allowed, worst = _judge(pairs, dtype)
        status, detail = ("pass" if ok else "fail"), ("" if ok else f"worst: {worst}")
    except _Skip as exc:
        return Result(check.name, path, _DT[dtype], "-", "skip", detail=str(exc))
    except Exception as exc:  # a crash is a failed check, with its reason
        shape, err, allowed, status = "-", None, None, "fail"
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        if os.environ.get("TILEATTN_CHECK_TRACEBACK"):
            traceback.print_exc()
    return Result(check.name, path, _DT[dtype], shape, status, err, allowed, time.perf_counter() - t0, detail)


def run(args) -> int:
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif args.device == "cuda" and not torch.cuda.is_available():
        print("tileattn: error: --device cuda asked for, but no CUDA device is visible. Without a GPU, "
              "`tileattn check --device cpu` checks the PyTorch tiled path and the Triton kernels under "
              "the interpreter.", file=sys.stderr)
        return 3
    else:
        device = torch.device(args.device)
    paths = tuple(dict.fromkeys(args.paths or PATHS))
    runs, notes = plan(device, paths)
    if args.only:
        runs = [r for r in runs if any(s in r[0].name for s in args.only)]
        if not runs:
            print(f"tileattn: error: --only {' '.join(args.only)} matches no check; checks: "
                  f"{', '.join(dict.fromkeys(c.name for c in CHECKS))}", file=sys.stderr)
            return 2
    results = _execute(runs, device, args.seed, notes, progress=not args.json and sys.stdout.isatty())
    failed = sum(r.status == "fail" for r in results)
    summary = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "paths": notes, "seed": args.seed, "passed": sum(r.status == "pass" for r in results),
               "failed": failed, "skipped": sum(r.status == "skip" for r in results),
               "torch": torch.__version__}
    if args.json:
        print(json.dumps({"summary": summary, "checks": [dataclasses.asdict(r) for r in results]}, indent=1))
    else:
        _print(results, summary)
    return 1 if failed or not summary["passed"] else 0


def _execute(runs, device, seed, notes, progress: bool) -> list[Result]:
    if not progress:
        return [run_one(c, p, dt, device, seed + i, notes) for i, (c, p, dt) in enumerate(runs)]
    try:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        return [run_one(c, p, dt, device, seed + i, notes) for i, (c, p, dt) in enumerate(runs)]
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task("checking", total=len(runs))
        for i, (c, p, dt) in enumerate(runs):
            bar.update(task, description=f"{c.name} [{p}{'' if dt is None else ' ' + _DT[dt]}]")
            results.append(run_one(c, p, dt, device, seed + i, notes))
            bar.advance(task)
    return results


def _fmt(x):
    return "-" if x is None else f"{x:.2e}"


def _print(results: list[Result], summary: dict) -> None:
    lines = [f"tileattn check on {summary['device']} (torch {summary['torch']}, seed {summary['seed']})"]
    lines += [f"  {path}: {note}" for path, note in summary["paths"].items()]
    verdict = (f"{summary['passed']} passed, {summary['failed']} failed, {summary['skipped']} skipped")
    try:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table
    except ImportError:
        for line in lines:
            print(line)
        for r in results:
            print(f"{r.status.upper():5} {r.check:30} {r.path:8} {r.dtype:5} {r.shape:40} err {_fmt(r.error)} "
                  f"<= {_fmt(r.allowed)} {r.detail}")
        print(verdict)
        return
    console = Console()
    for line in lines:
        console.print(line, highlight=False)
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for col, just in (("result", "left"), ("check", "left"), ("path", "left"), ("dtype", "left"),
                      ("shape", "left"), ("error", "right"), ("allowed", "right"), ("time", "right")):
        table.add_column(col, justify=just, no_wrap=col != "shape")
    style = {"pass": "[green]PASS[/]", "fail": "[bold red]FAIL[/]", "skip": "[yellow]skip[/]"}
    notes = []
    for r in results:
        table.add_row(style[r.status], r.check, r.path, r.dtype, r.shape, _fmt(r.error), _fmt(r.allowed),
                      f"{r.seconds:.1f}s" if r.status != "skip" else "")
        if r.detail:
            notes.append(f"{style[r.status]} {escape(f'{r.check} [{r.path} {r.dtype}]: {r.detail}')}")
    console.print(table)
    for note in dict.fromkeys(notes):
        console.print(note, highlight=False)
    console.print(("[bold red]" if summary["failed"] else "[green]") + verdict + "[/]")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("check", help="correctness of every path on this machine (pass/fail table)",
                       description=__doc__ + "\n" + EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--paths", nargs="+", choices=PATHS, default=None, help="default: both")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME",
                   help="run the checks whose name contains one of these (e.g. varlen kvcache)")
    p.add_argument("--seed", type=int, default=0, help="random inputs (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=run)
    return p
