"""The driver CLI (``python -m migraphx_ep.driver``) on a small ONNX model, and verify/bisect in process."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from migraphx_ep import driver, mxr
from migraphx_ep.driver import commands
from migraphx_ep.driver.inputs import generate_driver_inputs, index_bounds
from migraphx_ep.driver.verify import bisect, compare, verify_program
from migraphx_ep.ir import Program
from migraphx_ep.ir.operation import make_op
from migraphx_ep.migraphx import generate_inputs, parse_onnx
from migraphx_ep.targets import RefTarget, TargetError, get_target


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """z = exp(relu(x * w) + y), x and y of dims [N, 3]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    w = numpy_helper.from_array(np.array([[1.0, -2.0, 3.0]], np.float32), "w")
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Add", ["b", "y"], ["c"]),
        helper.make_node("Exp", ["c"], ["z"]),
    ]
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 3])
    g = helper.make_graph(nodes, "g", [x, y], [z], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = str(tmp_path_factory.mktemp("driver") / "m.onnx")
    onnx.save(m, path)
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    # The installed package, as a user runs it (a plain checkout's src/ has no native library).
    return subprocess.run(
        [sys.executable, "-m", "migraphx_ep.driver", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_read_params_compile_save(model, tmp_path):
    r = cli("params", model, "--input-dim", "x:2,3", "--input-dim", "y:2,3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["x: float_type, {2, 3}, {3, 1}", "y: float_type, {2, 3}, {3, 1}"]
    assert "parsing" in r.stderr  # progress goes to stderr
    r = cli("read", model, "--default-dim", "4", "-q")
    assert r.returncode == 0 and "exp" in r.stdout and "{4, 3}" in r.stdout and "parsing" not in r.stderr
    out = str(tmp_path / "m.mxr")
    r = cli("compile", model, "--ref", "--default-dim", "2", "-o", out)
    assert r.returncode == 0, r.stderr
    assert 'module: "main"' in r.stdout and os.path.exists(out)
    prog = mxr.load(out)
    assert prog.is_compiled() and prog.target_name == "ref"
    r = cli("params", out)
    assert r.returncode == 0 and "x: float_type, {2, 3}" in r.stdout


def test_cli_run_matches_reference(model):
    r = cli("run", model, "--ref", "--default-dim", "2", "--seed", "3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("output 0: float32 [2, 3]: min ")
    inputs = generate_inputs(parse_onnx(model, 2).ir.get_parameter_shapes(), seed=3)
    want = np.exp(np.maximum(inputs["x"] * [1, -2, 3], 0) + inputs["y"]).astype(np.float32)
    printed = r.stdout.splitlines()[1].strip(" []").split(", ")
    np.testing.assert_allclose([float(v) for v in printed], want.ravel(), rtol=1e-6)


def test_cli_perf_and_verify(model, tmp_path):
    r = cli("perf", model, "--iterations", "3", "--default-dim", "2")
    assert r.returncode == 0, r.stderr
    assert "Total time:" in r.stdout and "for 3 iterations" in r.stdout
    assert "exp(" in r.stdout and "operator" in r.stdout and "perf: iteration 3/3" in r.stderr
    r = cli("verify", model, "--ref", "--fp16", "--default-dim", "2")
    assert r.returncode == 0 and "matches ref" in r.stdout, r.stdout + r.stderr


def test_cli_errors(model, tmp_path):
    r = cli("run", str(tmp_path / "missing.onnx"))
    assert r.returncode == 1 and "error:" in r.stderr and "missing.onnx" in r.stderr
    r = cli("params", model, "--input-dim", "x=2,3")
    assert r.returncode == 1 and "name:d1,d2" in r.stderr
    try:
        get_target("gpu")
    except TargetError:
        r = cli("run", model, "--gpu")
        assert r.returncode == 1 and "gpu" in r.stderr
    bad = tmp_path / "bad.mxr"
    bad.write_bytes(mxr.MAGIC + b"\xc4\x02zz")
    r = cli("read", str(bad))
    assert r.returncode == 1 and "bad.mxr" in r.stderr and "Traceback" not in r.stderr
    r = cli("frobnicate", model)
    assert r.returncode == 2


class BuggyTarget(RefTarget):
    """Ref, then a deliberate fault: ``relu`` becomes ``neg`` (``always``), or ``exp`` becomes ``neg``
    only where the exp's input has no other reader (like a fusion bug that needs the value to be private)."""

    name = "buggy"

    def __init__(self, fault: str) -> None:
        self.fault = fault

    def compile(self, prog, options):
        exe = super().compile(prog, options)
        m = prog.get_main_module()
        for ins in list(m.instructions):
            if self.fault == "always" and ins.name == "relu":
                m.replace_instruction(ins, make_op("neg"))
            if self.fault == "private" and ins.name == "exp" and len(ins.inputs[0].outputs) == 1:
                m.replace_instruction(ins, make_op("neg"))
        return exe


def test_verify_and_bisect_find_the_fault(model):
    prog = parse_onnx(model, 2).ir
    inputs = generate_inputs(prog.get_parameter_shapes(), seed=1)
    assert verify_program(prog, RefTarget(), inputs, 1e-3, 1e-5) == []
    problems = verify_program(prog, BuggyTarget("always"), inputs, 1e-3, 1e-5)
    assert len(problems) == 1 and problems[0].startswith("output 0:")
    found = bisect(prog, BuggyTarget("always"), inputs, 1e-3, 1e-5)
    assert found is not None and found.method == "intermediates" and "relu(" in found.text
    found = bisect(prog, BuggyTarget("private"), inputs, 1e-3, 1e-5)
    assert found is not None and found.method == "prefix" and "exp(" in found.text
    assert bisect(prog, RefTarget(), inputs, 1e-3, 1e-5) is None
    assert str(prog) == str(parse_onnx(model, 2).ir)  # bisect works on copies


def test_verify_command_bisects(model, monkeypatch, capsys):
    monkeypatch.setattr(commands, "get_target", lambda name: BuggyTarget("always"))
    rc = driver.main(["verify", model, "--default-dim", "2", "--bisect", "-q"])
    out = capsys.readouterr().out
    assert rc == 1 and "DIFFERS" in out and "relu(" in out
    assert "first differing instruction (intermediates)" in out


def test_compare_rules():
    f = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    assert compare(f, f.copy(), 0, 0) is None
    assert "NaN" in compare(np.array([1.0, 2.0, np.inf, -np.inf], np.float32), f, 1, 1)
    assert "1 of 4 values differ" in compare(np.array([1.0, np.nan, -np.inf, -np.inf], np.float32), f, 1, 1)
    assert compare(np.array([1.001], np.float32), np.array([1.0], np.float32), 2e-3, 0) is None
    assert compare(np.array([1.01], np.float32), np.array([1.0], np.float32), 2e-3, 0) is not None
    assert "element type" in compare(np.array([1], np.int32), np.array([1], np.int64), 0, 0)
    assert "2 of 3" in compare(np.array([1, 5, 6]), np.array([1, 2, 3]), 1.0, 1.0)  # integers: exact
    assert compare(np.zeros((0, 2)), np.zeros((0, 2)), 0, 0) is None
    assert isinstance(Program(), Program)


MODELS = os.path.join(os.path.dirname(__file__), "..", "models")


def _gather_model(tmp_path, offset: int | None = None) -> str:
    """y = table[i] for a constant table of 3 rows; with ``offset``, y = table[i + offset]."""
    i = helper.make_tensor_value_info("i", TensorProto.INT64, ["N", 4])
    table = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2), "table")
    nodes = [helper.make_node("Cast", ["i"], ["i32"], to=TensorProto.INT32)]  # followed to the gather
    idx = "i32"
    if offset is not None:
        nodes.append(helper.make_node("Add", ["i32", "k"], ["shifted"]))
        idx = "shifted"
    nodes.append(helper.make_node("Gather", ["table", idx], ["y"], axis=0))
    inits = [table, numpy_helper.from_array(np.array(offset or 0, np.int32), "k")] if offset else [table]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 2])
    m = helper.make_model(
        helper.make_graph(nodes, "g", [i], [y], inits), opset_imports=[helper.make_opsetid("", 17)]
    )
    m.ir_version = 8
    path = str(tmp_path / ("shifted.onnx" if offset else "gather.onnx"))
    onnx.save(m, path)
    return path


def test_generated_index_inputs_stay_inside_what_they_index(tmp_path):
    prog = parse_onnx(_gather_model(tmp_path), 64).ir
    assert index_bounds(prog) == {"i": 3}
    for seed in range(5):
        i = generate_driver_inputs(prog, seed=seed)["i"]
        assert i.dtype == np.int64 and i.shape == (64, 4) and i.min() >= 0 and i.max() <= 2
    assert len(np.unique(generate_driver_inputs(prog, seed=0)["i"])) == 3  # still random over [0, 3)
    bert = parse_onnx(os.path.join(MODELS, "bert.onnx"), 2).ir
    assert index_bounds(bert) == {"input_ids": 100, "token_type_ids": 2}  # vocab and type-vocab sizes


def test_cli_run_bert_with_generated_token_ids():
    r = cli("run", os.path.join(MODELS, "bert.onnx"), "--ref", "--default-dim", "2", "-q")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("output 0: float32 [2, 2, 32]: min ") and "nan 0 inf 0" in r.stdout
    assert r.stderr == ""


def test_cli_failures_are_one_error_line_never_a_traceback(tmp_path):
    # An index computed by arithmetic is out of range at run time (IndexError): one line, status 1.
    r = cli("run", _gather_model(tmp_path, offset=10), "--ref", "--default-dim", "2", "-q")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [r.stderr.strip()] and r.stderr.startswith("error: IndexError: gather")
    for bad in (
        ["frobnicate", "m.onnx"],
        ["perf", "m.onnx", "--iterations", "0"],
        ["verify", "m.onnx", "--rtol", "x"],
    ):
        r = cli(*bad)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.splitlines() == [r.stderr.strip()] and r.stderr.startswith("error: argument ")


def _time_table(stdout: str) -> list[list[str]]:
    """The rows of the --time table (after its title and header), split into words."""
    lines = stdout.splitlines()
    start = lines.index("compile time (ref target), by stage:")
    assert lines[start + 1].split() == ["stage", "seconds", "share", "counts"]
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("total"))
    return [line.split() for line in lines[start + 2 : end + 1]]


def test_cli_compile_time_by_stage_on_ref():
    dims = [a for n in ("input_ids", "attention_mask", "token_type_ids") for a in ("--input-dim", f"{n}:2,8")]
    r = cli("compile", os.path.join(MODELS, "bert.onnx"), "--ref", "--time", "-q", *dims)
    assert r.returncode == 0, r.stderr
    rows = _time_table(r.stdout)
    # The ref target parses and runs passes; gpu stages (lowering, nvrtc...) did not run: left out.
    assert [row[0] for row in rows] == ["load", "parse", "passes", "other", "total"]
    seconds = [float(row[1]) for row in rows]
    shares = [float(row[2].rstrip("%")) for row in rows]
    assert seconds[-1] > 0 and abs(sum(seconds[:-1]) - seconds[-1]) <= 0.003  # the stages add up
    assert abs(sum(shares[:-1]) - 100.0) <= 0.3 and shares[-1] == 100.0
    assert seconds[2] > 0  # the passes really ran
    assert r.stdout.splitlines()[-1].startswith("total")  # the program first, the table at the end
    assert "@return(" in r.stdout.split("compile time")[0]
    r = cli("compile", os.path.join(MODELS, "bert.onnx"), "--ref", "-q", *dims)
    assert r.returncode == 0 and "compile time" not in r.stdout  # only when asked


def test_run_time_by_stage_comes_before_the_outputs(model, capsys):
    assert driver.main(["run", model, "--ref", "--default-dim", "2", "--fp16", "--time", "-q"]) == 0
    out = capsys.readouterr().out
    assert [row[0] for row in _time_table(out)] == ["load", "parse", "quantize", "passes", "other", "total"]
    assert out.index("compile time") < out.index("output 0:")
