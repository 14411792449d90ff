"""tools/cache_load.py on the ref target: the first session fills the cache, the next one loads from it
(so its Compile and .mxr load are timed, and nothing is compiled again)."""

from __future__ import annotations

import os
import re

from conftest import load_script

HERE = os.path.dirname(__file__)


def _tool():
    return load_script(os.path.join(HERE, "..", "tools", "cache_load.py"), "cache_load")


def test_a_load_is_split_into_our_calls(capsys):
    tool = _tool()
    model = os.path.join(HERE, "models", "bert.onnx")
    assert tool.main([model, "--target", "ref", "--loads", "1", "--seq", "8"]) == 0
    out = capsys.readouterr().out
    assert "ORT, CPU EP alone, optimizations off" in out
    fill = re.search(r"^fill: .*\(ms: (.*)\)$", out, re.M)
    load = re.search(r"^load #1: .*\(ms: (.*)\)$", out, re.M)
    assert fill and load, out
    assert "mxr load 0" in fill.group(1)  # nothing to load yet: it compiled
    spent = dict(kv.rsplit(" ", 1) for kv in load.group(1).split(", "))
    assert {"capability", "compile", "fingerprint", "mxr load"} <= set(spent) and int(spent["mxr load"]) >= 0


def test_a_given_cache_dir_is_filled_once_then_only_loaded(tmp_path, capsys):
    tool = _tool()
    model = os.path.join(HERE, "models", "bert.onnx")
    common = ["--target", "ref", "--seq", "8", "--no-ort", "--cache-dir", str(tmp_path)]
    assert tool.main([model, "--loads", "0", *common]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fill: ") and "load #" not in out and "ORT," not in out
    assert any(f.endswith(".mxr") for f in os.listdir(tmp_path))
    assert tool.main([model, "--loads", "1", *common]) == 0  # as a restarted process would
    out = capsys.readouterr().out
    assert out.startswith("load #1: ") and "fill" not in out and ".mxr load: " in out
