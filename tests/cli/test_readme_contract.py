"""README.md as a contract: every public function's full signature stands
on a line of its own that starts with its qualified name
(``tileattn.attention(q, k, v, *, ...)``), matching the function; every
``tileattn`` subcommand is in the Command line section."""
import inspect
import re
from pathlib import Path

import pytest

import tileattn
import tileattn.distributed
from tileattn import cli

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def _public_functions() -> dict[str, object]:
    out = {}
    for prefix, module in (("tileattn", tileattn), ("tileattn.distributed", tileattn.distributed)):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj):
                out[f"{prefix}.{name}"] = obj
    out["tileattn.reference.standard_attention"] = tileattn.reference.standard_attention
    out["tileattn.cpu.tiled_attention"] = tileattn.cpu.tiled_attention
    return out


FUNCTIONS = _public_functions()


def _written(qualified: str) -> list[list[str]]:
    """The parameters of each README line that starts with ``qualified(``."""
    out = []
    for m in re.finditer(rf"^{re.escape(qualified)}\(", README, re.M):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(README[i], 0)
            i += 1
        inner = " ".join(README[m.end():i - 1].split())
        out.append([p.strip() for p in inner.split(",") if p.strip()])
    return out


def _actual(fn) -> list[str]:
    out, star = [], False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        if p.kind is p.VAR_POSITIONAL:
            out.append("*" + p.name)
            star = True
        elif p.kind is p.VAR_KEYWORD:
            out.append("**" + p.name)
        elif p.default is p.empty:
            out.append(p.name)
        else:
            out.append(f"{p.name}={p.default!r}".replace("'", '"'))
    return out


def test_the_public_surface_is_found():
    assert {"tileattn.attention", "tileattn.attention_varlen", "tileattn.attention_with_kvcache",
            "tileattn.distributed.ring_attention"} <= set(FUNCTIONS)


@pytest.mark.parametrize("qualified", sorted(FUNCTIONS))
def test_signature_matches(qualified):
    written, actual = _written(qualified), _actual(FUNCTIONS[qualified])
    assert written, f"README shows no line that starts with {qualified}("
    assert actual in written, f"README's {qualified}({', '.join(written[-1])}) is not ({', '.join(actual)})"


def test_every_command_is_listed():
    block = README.split("## Command line", 1)[1].split("```", 2)[1]
    listed = set(re.findall(r"^tileattn (\w+)", block, re.M))
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == listed
