"""_env.env reads the switches (TILEATTN_*, TRITON_INTERPRET) on every
launch; it must see exactly what os.environ.get sees, however the variable
was set or removed."""
import os

import pytest

from tileattn import _env
from tileattn.launch import runtime

NAME = "TILEATTN_TEST_SWITCH"


@pytest.mark.parametrize("value", ["0", "1", "", "höhe", "a=b"], ids=["zero", "one", "empty", "non-ascii", "equals"])
def test_env_reads_what_os_environ_holds(value, monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert _env.env(NAME, "default") == os.environ.get(NAME, "default") == "default"
    monkeypatch.setenv(NAME, value)
    assert _env.env(NAME, "default") == os.environ.get(NAME) == value
    os.environ[NAME] = value + "x"
    assert _env.env(NAME, "default") == value + "x"
    monkeypatch.delenv(NAME)
    assert _env.env(NAME, "default") == "default"


def test_switches_follow_the_environment(monkeypatch):
    monkeypatch.setenv("TILEATTN_AUTOTUNE", "0")
    assert not runtime.autotune_enabled()
    monkeypatch.setenv("TILEATTN_AUTOTUNE", "1")
    assert runtime.autotune_enabled()
    monkeypatch.setenv("TILEATTN_DIRECT_LAUNCH", "0")
    assert not runtime._direct_enabled()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not _env.interpreter_active()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert _env.interpreter_active()
