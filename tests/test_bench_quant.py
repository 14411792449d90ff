"""bench/ int8 and fp8 rows without a GPU: --dtypes, the calibration table and QDQ model (made once, then
taken from --model-dir), what each system runs, the fp32 reference, and run.py + report.py end to end on
ORT's CPU EP and our EP's ref target (the CUDA systems write 'unavailable' lines here)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import quant_rows  # noqa: E402
import report  # noqa: E402
import run  # noqa: E402
import specs  # noqa: E402
import systems  # noqa: E402

MODEL = REPO / "tests" / "models" / "resnet.onnx"  # fp32, 22 nodes: Conv, Gemm, input [batch, 3, 32, 32]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A copy of the fp32 model inside the model dir (its mtime is the test's to change)."""
    path = tmp_path / "resnet.onnx"
    shutil.copy(MODEL, path)
    return path


def make_row(path: Path, dtype: str, **ep_options: str) -> systems.Row:
    settings = systems.Settings(ep_options={"migraphx_target": "ref", **ep_options})
    feeds = specs.feeds_for_file(path, 2, 16, seed=0)
    return systems.Row(path.stem, dtype, 2, path, feeds, None, settings, {})


def test_parse_dtypes() -> None:
    assert specs.parse_dtypes("fp16,int8,fp8") == ["fp16", "int8", "fp8"]
    assert specs.parse_dtypes(" int8 , int8,fp32") == ["int8", "fp32"]
    for bad in ("bf16", "fp16,int4", "", ","):
        with pytest.raises(ValueError, match="unknown dtypes"):
            specs.parse_dtypes(bad)


def test_plan_rows(tmp_path: Path) -> None:
    def plan(models: str, dtypes: str) -> list[tuple[str, str, int, str]]:
        ns = argparse.Namespace(models=models, dtypes=dtypes, batches="1", model_dir=str(tmp_path))
        return [(name, dtype, b, path.name) for name, dtype, b, path, _ in run.plan_rows(ns)]

    assert plan("resnet50", "fp16,int8,fp8") == [
        ("resnet50", "fp16", 1, "resnet50_fp16.onnx"),
        ("resnet50", "int8", 1, "resnet50_fp32.onnx"),  # int8/fp8 rows start from the fp32 export
        ("resnet50", "fp8", 1, "resnet50_fp32.onnx"),
    ]
    fp32, fp16 = str(MODEL), str(MODEL.with_name("resnet_fp16.onnx"))
    assert [r[1] for r in plan(fp32, "fp32,fp16,int8")] == ["fp32", "int8"]
    assert [r[1] for r in plan(fp32, "int8,fp8")] == ["int8", "fp8"]  # only what was asked for
    assert [r[1] for r in plan(fp16, "fp16,int8")] == ["fp16"]  # no int8 row from an fp16 file


def test_skip_reason() -> None:
    assert quant_rows.skip_reason("migraphx_ep", "int8") is None
    assert quant_rows.skip_reason("ort_cuda_iobinding", "int8") is None
    assert "torch" in quant_rows.skip_reason("torch_eager", "int8")
    assert "fp8" in quant_rows.skip_reason("ort_cuda_numpy", "fp8")
    assert quant_rows.skip_reason("migraphx_ep", "fp8") is None
    assert quant_rows.skip_reason("migraphx_ep_qdq", "fp16") == ""  # silently not applicable
    assert quant_rows.skip_reason("torch_eager", "fp16") is None


def test_table_and_qdq_made_once(model: Path) -> None:
    row = make_row(model, "int8")
    quant = quant_rows.Quant(model.parent, samples=2, seq=16)
    table, qdq = quant.table(row), quant.qdq(row)
    assert table.parent == qdq.parent == model.parent
    assert table.name.startswith("resnet.calib-n2") and qdq.name.endswith(".qdq.onnx")
    doc = json.loads(table.read_text())
    assert doc["CLS"] == "TensorsData" and "pixel_values" in doc["data"]
    g = onnx.load(str(qdq)).graph
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= {n.op_type for n in g.node}
    zero_types = {i.name: i.data_type for i in g.initializer}
    q_zeros = {zero_types[n.input[2]] for n in g.node if n.op_type == "QuantizeLinear"}
    assert q_zeros == {onnx.TensorProto.UINT8}  # ORT's default: uint8 activations with zero points
    assert all(p.seconds is not None for p in quant.made.values())
    assert sorted(p.name for p in model.parent.iterdir()) == sorted([model.name, table.name, qdq.name])

    stamps = (table.stat().st_mtime_ns, qdq.stat().st_mtime_ns)
    again = quant_rows.Quant(model.parent, samples=2, seq=16)  # a second run: from the files
    assert (again.table(row), again.qdq(row)) == (table, qdq)
    assert all(p.seconds is None for p in again.made.values())
    assert (table.stat().st_mtime_ns, qdq.stat().st_mtime_ns) == stamps
    assert quant_rows.Quant(model.parent, samples=3, seq=16).prefix(row) != quant.prefix(row)

    future = table.stat().st_mtime + 100  # the model re-exported after the files were made
    os.utime(model, (future, future))
    fresh = quant_rows.Quant(model.parent, samples=2, seq=16)
    assert fresh.table(row) == table and fresh.made[(model.resolve(), "table")].seconds is not None


def test_system_row(model: Path) -> None:
    quant = quant_rows.Quant(model.parent, samples=2, seq=16, extra_options={"migraphx_fp16_enable": "1"})
    row = make_row(model, "fp8", migraphx_exhaustive_tune="1")
    ours = quant.system_row(row, "migraphx_ep_iobinding")
    assert ours.path == model and ours.cache is row.cache
    opts = ours.settings.ep_options
    assert opts["migraphx_fp8_enable"] == "1" and opts["migraphx_fp16_enable"] == "1"
    assert opts["migraphx_target"] == "ref" and opts["migraphx_exhaustive_tune"] == "1"
    assert Path(opts["migraphx_int8_calibration_table_name"]).is_file()
    assert "migraphx_fp8_enable" not in row.settings.ep_options  # the row itself is left alone
    int8 = make_row(model, "int8")
    peer = quant.system_row(int8, "ort_cuda_numpy")
    assert peer.path.name.endswith(".qdq.onnx") and peer.cache is int8.cache
    assert peer.settings.ep_options == int8.settings.ep_options
    float_row = make_row(model, "fp32")
    assert quant.system_row(float_row, "migraphx_ep") is float_row
    rec = quant.record(int8, "migraphx_ep")
    assert rec["table"].endswith(".json") and rec["ep_options"]["migraphx_int8_enable"] == "1"
    assert quant.record(int8, "ort_cpu")["qdq"] == peer.path.name


def test_failures_are_errors_once(tmp_path: Path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(onnx.load(str(MODEL)).SerializeToString()[:200])  # a truncated file
    row = systems.Row("broken", "int8", 1, broken, {}, None, systems.Settings(), {})
    quant = quant_rows.Quant(tmp_path, samples=1, seq=16)
    with pytest.raises(quant_rows.QuantError, match="table for broken.onnx"):
        quant.table(row)
    with pytest.raises(quant_rows.QuantError):
        quant.system_row(row, "migraphx_ep")  # the same error, not a second calibration
    assert len(quant.made) == 1
    ref, error = quant.reference(row)
    assert ref is None and error.startswith("no fp32 reference")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.onnx"]  # no scratch left behind


def test_reference_and_tolerance(model: Path) -> None:
    quant = quant_rows.Quant(model.parent, samples=1, seq=16)
    row = make_row(model, "int8")
    ref, error = quant.reference(row)
    assert error == "" and ref[0].shape == (2, 10)
    acc = run.quant_accuracy([ref[0] * 1.05], row, quant)["vs_fp32"]
    assert (
        acc["ok"] and acc["tol"] == specs.MAX_REL["int8"] and acc["max_rel"] == pytest.approx(0.05, rel=1e-3)
    )
    assert not run.flag({"max_abs": 1.0, "max_rel": 0.05, "nonfinite": 0}, "fp16")["ok"]
    assert not run.flag({"max_abs": 0.0, "max_rel": 0.0, "nonfinite": 1}, "int8")["ok"]
    assert run.flag({"error": "2 outputs vs 1"}, "int8") == {"error": "2 outputs vs 1"}


def _lines(path: Path) -> dict[tuple[str, str], dict]:
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    return {(r["dtype"], r["system"]): r for r in recs if r["kind"] == "result"}


def test_run_and_report_end_to_end(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.jsonl"
    systems_ = "ort_cuda_numpy,torch_eager,ort_cpu,migraphx_ep,migraphx_ep_qdq"
    cmd = [
        sys.executable,
        str(REPO / "bench" / "run.py"),
        "--models",
        str(model),
        "--dtypes",
        "fp32,int8,fp8",
    ]
    cmd += ["--systems", systems_, "--ep-option", "migraphx_target=ref", "--runs", "2", "--warmup", "1"]
    cmd += ["--calib", "2", "--model-dir", str(tmp_path), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    got = _lines(out)

    for system in ("ort_cpu", "migraphx_ep", "migraphx_ep_qdq"):
        acc = got[("int8", system)]["accuracy"]
        assert list(acc) == ["vs_fp32"] and acc["vs_fp32"]["ok"], (system, acc)  # fp32 is the reference
        assert got[("int8", system)]["runs"] >= 1
    assert got[("int8", "migraphx_ep")]["options"]["migraphx_int8_enable"] == "1"
    assert got[("int8", "migraphx_ep")]["placement"]["fallback"] is False
    assert got[("int8", "migraphx_ep_qdq")]["quant"]["runs"] == "QDQ model"
    assert got[("fp8", "migraphx_ep")]["accuracy"]["vs_fp32"]["ok"]
    assert "vs_ort_cpu" in got[("fp32", "migraphx_ep")]["accuracy"]
    assert ("fp32", "migraphx_ep_qdq") not in got  # not applicable outside int8 rows: no line
    assert "torch" in got[("int8", "torch_eager")]["skipped"]
    assert "fp8" in got[("fp8", "ort_cpu")]["skipped"] and "fp8" in got[("fp8", "migraphx_ep_qdq")]["skipped"]
    cuda = got[("int8", "ort_cuda_numpy")]
    assert "ms" in cuda or cuda["unavailable"], cuda  # onnxruntime-gpu where there is one

    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)  # again: cached files
    assert done.returncode == 0, done.stdout + done.stderr
    again = _lines(out)
    assert again[("int8", "ort_cpu")]["quant"]["qdq_made_s"] is None
    assert again[("fp8", "migraphx_ep")]["quant"]["table_made_s"] is None

    md, js = tmp_path / "b.md", tmp_path / "b.json"
    subprocess.run(
        [sys.executable, str(REPO / "bench" / "report.py"), str(out), "--md", str(md), "--json", str(js)]
    )
    text = md.read_text()
    assert "### int8: median ms per run" in text and "### fp8: median ms per run" in text
    assert "### int8 and fp8 against the fp32 model" in text and "Not run: " in text


def test_report_ratios_stay_within_one_run() -> None:
    # Two files: the quant run's own fp16 row (1.0 ms) and a later fp16 run (2.0 ms, shown in the fp16
    # table). The int8 row's ratio to our fp16 row takes its own run's, as it does for its peers.
    def rec(source: str, dtype: str, system: str, ms: float) -> dict:
        return {"kind": "result", "model": "resnet50", "batch": 1, "dtype": dtype, "system": system,
                "ms": ms, "source": source}  # fmt: skip

    results = [
        rec("quant.jsonl", "fp16", "migraphx_ep_iobinding", 1.0),
        rec("quant.jsonl", "int8", "migraphx_ep_iobinding", 0.5),
        rec("quant.jsonl", "int8", "ort_cuda_iobinding", 2.0),
        rec("fp16.jsonl", "fp16", "migraphx_ep_iobinding", 2.0),
        rec("fp16.jsonl", "fp16", "ort_cuda_iobinding", 8.0),
    ]
    text = report.markdown([], results, [], ["quant.jsonl", "fp16.jsonl"])
    int8 = text[text.index("### int8: median") : text.index("## Compile")]
    head, _, row = int8.strip().splitlines()[-3:]
    cells = dict(zip(head.strip("| ").split(" | "), row.strip("| ").split(" | "), strict=True))
    assert cells["ours IOB / ours IOB fp16"] == "0.50"  # over 1.0 (its run), not 2.0 (the latest)
    fp16 = text[text.index("### fp16: median") : text.index("### int8: median")]
    assert "| 2.000 |" in fp16 and "0.25" in fp16  # the fp16 table shows the latest run


def test_report_ratios_and_flags() -> None:
    def rec(dtype: str, system: str, **kw: object) -> dict:
        return {"kind": "result", "model": "resnet50", "batch": 1, "dtype": dtype, "system": system, **kw}

    over = {"vs_fp32": {"max_abs": 1.0, "max_rel": 0.3, "nonfinite": 0, "tol": 0.1, "ok": False}}
    ok = {"vs_fp32": {"max_abs": 0.1, "max_rel": 0.03, "nonfinite": 0, "tol": 0.1, "ok": True}}
    results = [
        rec("fp16", "migraphx_ep_iobinding", ms=1.0),
        rec("int8", "migraphx_ep_iobinding", ms=0.5, accuracy=ok),
        rec("int8", "ort_cuda_iobinding", ms=2.0, accuracy=over),
        rec("int8", "torch_eager", skipped="torch runs no int8 rows"),
        rec("fp8", "migraphx_ep", ms=0.6, accuracy=ok, quant={"ep_options": {"migraphx_fp16_enable": "1"}}),
    ]
    text = report.markdown([], results, [], ["x.jsonl"])
    int8 = text[text.index("### int8: median") : text.index("### fp8: median")]
    assert "torch eager" not in int8  # a column only for systems that ran
    head, _, row = int8.strip().splitlines()[-3:]
    cells = dict(zip(head.strip("| ").split(" | "), row.strip("| ").split(" | "), strict=True))
    assert cells["ours IOB / ORT CUDA QDQ IOB"] == "0.25" and cells["ours IOB / ours IOB fp16"] == "0.50"
    fp8 = text[text.index("### fp8: median") : text.index("## Compile")]
    assert "`migraphx_fp16_enable=1`" in fp8 and "ORT CUDA QDQ" not in fp8
    assert "3.0e-01 **over**" in text and "3.0e-02 |" in text
    assert "Not run: torch_eager (int8): torch runs no int8 rows." in text
    assert report._dtype_key("int8") < report._dtype_key("fp8") < report._dtype_key("bf16")
    np.testing.assert_equal(specs.make_feeds(specs.MODELS["resnet50"], 1, "int8")["input"].dtype, np.float32)
