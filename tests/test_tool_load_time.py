"""tools/load_time.py on the ref target: a static copy of the model, then fresh-process loads cold, from
the model cache and from an EPContext model compiled by the tool, each with its times."""

from __future__ import annotations

import os
import re

import onnx

from conftest import load_script

HERE = os.path.dirname(__file__)
MODEL = os.path.join(HERE, "models", "bert.onnx")


def _tool():
    return load_script(os.path.join(HERE, "..", "tools", "load_time.py"), "load_time")


def test_static_copy_fixes_every_symbolic_dim(tmp_path):
    out = str(tmp_path / "s.onnx")
    _tool().static_copy(MODEL, {"sequence": 8}, out)
    m = onnx.load(out)
    shapes = [v.type.tensor_type.shape.dim for v in [*m.graph.input, *m.graph.output]]
    assert all(not d.dim_param for shape in shapes for d in shape)
    assert [1, 8] in [
        [d.dim_value for d in shape] for shape in shapes
    ]  # batch (unnamed on the command line) is 1, sequence 8


def test_three_kinds_of_load_each_in_a_fresh_process(tmp_path, capsys):
    args = ["--target", "ref", "--loads", "1", "--dim", "sequence=8", "--work", str(tmp_path)]
    assert _tool().main([MODEL, *args]) == 0
    out = capsys.readouterr().out
    for kind in ("cold", "model cache", "EPContext"):
        row = re.search(rf"^{kind} #1: ([\d.]+), ([\d.]+), ([\d.]+), ([\d.]+)$", out, re.M)
        assert row, out
        assert all(float(x) >= 0 for x in row.groups()) and float(row.group(2)) > 0
        assert re.search(rf"^median {kind}: .*\(session \+ first Run [\d.]+ s\)$", out, re.M), out
    assert os.path.isfile(tmp_path / "static_ctx.onnx")
    assert any(f.endswith(".mxr") for f in os.listdir(tmp_path / "cache"))
