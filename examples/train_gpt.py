#!/usr/bin/env python
"""Train a small GPT on Shakespeare, one character at a time, with a chosen attention.

    python examples/train_gpt.py                                   # tiny CPU run (< 1 min)
    python examples/train_gpt.py --attn sdpa --steps 100
    python examples/train_gpt.py --device cuda --preset gpu --compare --steps 300 --out runs/h200

The model is a GPT-2-style decoder (token + position embeddings, pre-norm
blocks of causal self-attention and a GELU MLP, tied output head), written
here in plain PyTorch.  Only the attention call changes with ``--attn``:

* ``tileattn``  ``tileattn.attention(q, k, v, causal=True)``
* ``sdpa``      ``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)``
* ``standard``  ``tileattn.reference.standard_attention`` (scores and probabilities materialised)

The seed fixes the initial weights and every batch, so runs that differ only
in ``--attn`` see identical data; their loss curves differ only by rounding.
``--compare`` trains tileattn and sdpa one after the other and plots both.

Every run writes ``<attn>.json`` (configuration, per-step loss, validation
loss, tokens/s, peak memory, versions) and ``<attn>_loss.png`` under
``--out``; ``--compare`` writes ``compare.json`` and ``compare_loss.png``.
The text is in examples/data/ (public domain; see its README.md).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import tileattn
from tileattn.reference import standard_attention

DATA = Path(__file__).resolve().parent / "data" / "shakespeare.txt"
ATTNS = ("tileattn", "sdpa", "standard")


# ---------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Config:
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    block_size: int = 64
    batch_size: int = 8
    lr: float = 3e-3
    steps: int = 200
    warmup: int = 10
    eval_every: int = 50
    eval_iters: int = 2
    vocab_size: int = 0  # set from the text


PRESETS = {
    # a CPU smoke run: a minute at most on two cores (the smoke test uses it)
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, block_size=64, batch_size=8, lr=3e-3, steps=200, warmup=10,
                 eval_every=50, eval_iters=2),
    # nanoGPT's Shakespeare-character model with a 1024-character context
    # (head dim 64): a few hundred steps take about a minute per attention on an H200
    "gpu": dict(n_layer=6, n_head=6, n_embd=384, block_size=1024, batch_size=32, lr=1e-3, steps=300, warmup=30,
                eval_every=50, eval_iters=10),
}


# ---------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------
def attend(kind: str, q, k, v):
    """Causal self-attention of (B, H, T, D) tensors by the chosen implementation."""
    if kind == "tileattn":
        return tileattn.attention(q, k, v, causal=True)
    if kind == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if kind == "standard":
        return standard_attention(q, k, v, causal=True)
    raise ValueError(f"attn must be one of {ATTNS}, got {kind!r}")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: Config, attn: str):
        super().__init__()
        self.n_head, self.attn = cfg.n_head, attn
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x):
        b, t, c = x.shape
        # (B, T, 3, H, D) -> three (B, H, T, D) views; no copies before the attention
        q, k, v = self.qkv(x).view(b, t, 3, self.n_head, c // self.n_head).permute(2, 0, 3, 1, 4)
        y = attend(self.attn, q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: Config, attn: str):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg, attn)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: Config, attn: str = "tileattn"):
        super().__init__()
        if attn not in ATTNS:
            raise ValueError(f"attn must be one of {ATTNS}, got {attn!r}")
        if cfg.n_embd % cfg.n_head:
            raise ValueError(f"n_embd ({cfg.n_embd}) must be a multiple of n_head ({cfg.n_head})")
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg, attn) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2: scaled init of the residual projections
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))

    @torch.no_grad()
    def sample(self, idx, n: int, generator=None):
        for _ in range(n):
            logits = self(idx[:, -self.cfg.block_size:])[:, -1].float()
            nxt = torch.multinomial(torch.softmax(logits, -1).cpu(), 1, generator=generator).to(idx.device)
            idx = torch.cat((idx, nxt), dim=1)
        return idx


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------
class CharData:
    """The text as integer ids, split 90 / 10 into training and validation."""

    def __init__(self, path: Path = DATA):
        text = Path(path).read_text(encoding="utf-8")
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        ids = torch.tensor([self.stoi[c] for c in text], dtype=torch.long)
        cut = int(0.9 * len(ids))
        self.train, self.val = ids[:cut], ids[cut:]

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)

    def batch(self, split: str, cfg: Config, gen: torch.Generator, device):
        data = self.train if split == "train" else self.val
        if len(data) <= cfg.block_size + 1:
            raise ValueError(f"block_size {cfg.block_size} is too long for the {split} text ({len(data)} chars)")
        ix = torch.randint(len(data) - cfg.block_size - 1, (cfg.batch_size,), generator=gen)
        x = torch.stack([data[i:i + cfg.block_size] for i in ix.tolist()])
        y = torch.stack([data[i + 1:i + 1 + cfg.block_size] for i in ix.tolist()])
        return x.to(device), y.to(device)


# ---------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------
def _lr(step: int, cfg: Config) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _rss_peak_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def train(attn: str, cfg: Config, data: CharData, device: torch.device, seed: int, dtype: str = "fp32",
          compile_model: bool = False, log=print) -> dict:
    """Train from ``seed``; return the run's record (losses, throughput, memory)."""
    torch.manual_seed(seed)
    model = GPT(cfg, attn).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.1)
    step_fn = torch.compile(model) if compile_model else model
    gen = torch.Generator().manual_seed(seed)
    amp = dtype == "bf16"
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)

    def evaluate() -> float:
        eval_gen = torch.Generator().manual_seed(seed + 1)  # the same validation batches every time
        model.eval()
        losses = []
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            for _ in range(cfg.eval_iters):
                x, y = data.batch("val", cfg, eval_gen, device)
                losses.append(step_fn(x, y).item())
        model.train()
        return sum(losses) / len(losses)

    losses, val, step_times = [], [], []
    tokens_per_step = cfg.batch_size * cfg.block_size
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = _lr(step, cfg)
        x, y = data.batch("train", cfg, gen, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = step_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())  # synchronizes: the step is done
        step_times.append(time.perf_counter() - t0)
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            val.append({"step": step + 1, "loss": evaluate()})
            log(f"{attn:>8} step {step + 1:5d}/{cfg.steps}  loss {losses[-1]:.4f}  val {val[-1]['loss']:.4f}  "
                f"{tokens_per_step / step_times[-1]:,.0f} tok/s")
    # throughput without the first steps (kernel compilation, autotuning, allocator warm-up)
    timed = step_times[min(len(step_times) - 1, max(1, len(step_times) // 10)):]
    median_step = statistics.median(timed)
    if cuda:
        peak, peak_kind = torch.cuda.max_memory_allocated(device), "cuda max_memory_allocated"
    else:
        peak, peak_kind = _rss_peak_bytes(), "process peak resident memory (VmHWM)"
    return {"attn": attn, "loss": losses, "val": val, "median_step_s": median_step,
            "tokens_per_s": tokens_per_step / median_step, "peak_memory_bytes": peak,
            "peak_memory_kind": peak_kind, "total_s": sum(step_times),
            "tileattn_path": ("Triton kernels" if attn == "tileattn" and tileattn.dispatch.uses_triton(x)
                              else "PyTorch tiled path" if attn == "tileattn" else None),
            "model": model}


# ---------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------
def _metadata(args, cfg: Config, device: torch.device) -> dict:
    return {"config": dataclasses.asdict(cfg), "seed": args.seed, "dtype": args.dtype,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "tileattn": tileattn.__version__, "compile": args.compile,
            "data": DATA.name, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S")}


def _record(run: dict) -> dict:
    return {k: v for k, v in run.items() if k != "model"}


def plot(runs: list[dict], path: Path, title: str) -> bool:
    """Training-loss curves (and validation points) of the runs; the difference
    of the first two below them.  False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    two = len(runs) == 2
    fig, axes = plt.subplots(2 if two else 1, 1, figsize=(8, 6 if two else 4), sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1]} if two else None)
    ax = axes[0][0]
    for run, style in zip(runs, ("-", "--", ":")):
        steps = range(1, len(run["loss"]) + 1)
        ax.plot(steps, run["loss"], style, lw=1.2, label=f"{run['attn']} (train)")
        if run["val"]:
            ax.plot([v["step"] for v in run["val"]], [v["loss"] for v in run["val"]], "o" + style, ms=4,
                    label=f"{run['attn']} (val)")
    ax.set_ylabel("cross-entropy (nats/char)")
    ax.set_title(title, fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    if two:
        diff = [a - b for a, b in zip(runs[0]["loss"], runs[1]["loss"])]
        bx = axes[1][0]
        bx.plot(range(1, len(diff) + 1), diff, lw=1)
        bx.axhline(0, color="k", lw=0.5)
        bx.set_ylabel(f"{runs[0]['attn']} − {runs[1]['attn']}")
        bx.grid(alpha=0.3)
    axes[-1][0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _summary(runs: list[dict]) -> None:
    rows = [(r["attn"], f"{r['loss'][-1]:.4f}", f"{r['val'][-1]['loss']:.4f}" if r["val"] else "-",
             f"{r['tokens_per_s']:,.0f}",
             "n/a" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / 2**20:,.0f} MiB")
            for r in runs]
    header = ("attention", "final loss", "final val", "tokens/s", "peak memory")
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print("  ".join(f"{h:>12}" for h in header))
        for row in rows:
            print("  ".join(f"{c:>12}" for c in row))
        return
    table = Table(title=f"peak memory: {runs[0]['peak_memory_kind']}")
    for h in header:
        table.add_column(h, justify="right")
    for row in rows:
        table.add_row(*row)
    Console().print(table)


# ---------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", choices=ATTNS, default="tileattn", help="attention implementation (default tileattn)")
    p.add_argument("--compare", action="store_true", help="train tileattn and sdpa with the same seed, plot both")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="default: gpu on CUDA, tiny on the CPU")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default=None,
                   help="bf16 autocast or fp32 (default: bf16 on CUDA, fp32 on the CPU)")
    p.add_argument("--out", default="runs/train_gpt", help="output folder (default runs/train_gpt)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--sample", type=int, default=0, metavar="N", help="print N sampled characters after training")
    for name in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "eval_every", "eval_iters", "warmup"):
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    return p


def _device(text: str) -> torch.device:
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(text)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but no CUDA device is visible; use --device cpu")
    return dev


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        device = _device(args.device)
    except (RuntimeError, ValueError) as exc:
        print(f"train_gpt: error: {exc}", file=sys.stderr)
        return 2
    preset = args.preset or ("gpu" if device.type == "cuda" else "tiny")
    cfg = Config(**PRESETS[preset])
    for field in ("steps", "n_layer", "n_head", "n_embd", "block_size", "batch_size", "eval_every", "eval_iters",
                  "warmup", "lr"):
        value = getattr(args, field)
        if value is not None:
            if value <= 0:
                print(f"train_gpt: error: --{field.replace('_', '-')} must be positive, got {value}", file=sys.stderr)
                return 2
            setattr(cfg, field, value)
    cfg.warmup = min(cfg.warmup, cfg.steps)
    args.dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    data = CharData()
    cfg.vocab_size = len(data.chars)
    if cfg.n_embd % cfg.n_head:
        print(f"train_gpt: error: --n-embd ({cfg.n_embd}) must be a multiple of --n-head ({cfg.n_head})",
              file=sys.stderr)
        return 2
    if cfg.block_size + 1 >= len(data.val):
        print(f"train_gpt: error: --block-size {cfg.block_size} is too long for the validation text "
              f"({len(data.val)} characters)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = _metadata(args, cfg, device)
    print(f"{preset} preset on {meta['device']} ({device}), {args.dtype}, {cfg.n_layer} layers x {cfg.n_head} heads "
          f"x {cfg.n_embd // cfg.n_head} head dim, context {cfg.block_size}, batch {cfg.batch_size}, "
          f"{cfg.steps} steps, seed {args.seed}")

    attns = ("tileattn", "sdpa") if args.compare else (args.attn,)
    runs = []
    try:
        for attn in attns:
            runs.append(train(attn, cfg, data, device, args.seed, args.dtype, args.compile))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    except ValueError as exc:
        print(f"train_gpt: error: {exc}", file=sys.stderr)
        return 2
    where = runs[0]["tileattn_path"] or ""
    title = (f"char-level GPT on {DATA.name}: {meta['device']}, {args.dtype}, seed {args.seed}"
             + (f" (tileattn: {where})" if where else ""))
    name = "compare" if args.compare else args.attn
    record = {**meta, "preset": preset, "runs": [_record(r) for r in runs]}
    if args.compare:
        a, b = runs[0]["loss"], runs[1]["loss"]
        record["max_abs_loss_diff"] = max(abs(x - y) for x, y in zip(a, b))
        record["final_loss_diff"] = a[-1] - b[-1]
    json_path = out / f"{name}.json"
    json_path.write_text(json.dumps(record, indent=1))
    png = out / f"{name}_loss.png"
    plotted = plot(runs, png, title)
    _summary(runs)
    if args.compare:
        print(f"max |loss(tileattn) - loss(sdpa)| over {cfg.steps} steps: {record['max_abs_loss_diff']:.4g}")
    print(f"wrote {json_path}" + (f" and {png}" if plotted else " (no plot: matplotlib is not installed)"))
    if args.sample:
        model = runs[0]["model"].eval()
        start = torch.tensor([[data.stoi["\n"]]], device=device)
        text = data.decode(model.sample(start, args.sample, torch.Generator().manual_seed(args.seed))[0].tolist())
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
