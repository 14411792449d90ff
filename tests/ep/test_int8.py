"""int8/fp8 through the EP with calibration tables: both table formats, errors, cache keys, real ORT runs."""

from __future__ import annotations

import json
import logging
import struct

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as oh
from onnx import numpy_helper as nh

from conftest import make_model, tensor
from migraphx_ep.ep.cache import graph_fingerprint, program_key
from migraphx_ep.ep.calibration import CalibrationError, load_table, read_table
from migraphx_ep.ep.options import OptionError, parse_options

EP = "MIGraphXExecutionProvider"
RNG = np.random.default_rng(3)
# Largest error on this model's outputs relative to the largest output magnitude, with per-tensor
# scales from the calibration data. Measured: int8 0.7-2.1%; fp8 E4M3 (3 mantissa bits, each value off
# by up to 1/16) 5-11.5%.
INT8_TOLERANCE = 0.05
FP8_TOLERANCE = 0.2


def conv_mlp(rng: np.random.Generator = RNG) -> bytes:
    """Conv -> Relu -> Flatten -> MatMul -> Add: one convolution and one dot to quantise."""
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((4 * 6 * 6, 5)).astype(np.float32) * 0.1
    b2 = rng.standard_normal(5).astype(np.float32)
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        oh.make_node("Relu", ["c"], ["r"], name="relu"),
        oh.make_node("Flatten", ["r"], ["f"], name="flatten"),
        oh.make_node("MatMul", ["f", "w2"], ["m"], name="matmul"),
        oh.make_node("Add", ["m", "b2"], ["y"], name="add"),
    ]
    inits = [nh.from_array(w, "w"), nh.from_array(w2, "w2"), nh.from_array(b2, "b2")]
    return make_model(nodes, [tensor("x", T.FLOAT, [2, 3, 6, 6])], [tensor("y", T.FLOAT, [2, 5])], inits)


def inputs(n: int = 4, rng: np.random.Generator = RNG) -> list[np.ndarray]:
    return [rng.standard_normal((2, 3, 6, 6)).astype(np.float32) for _ in range(n)]


def tensor_ranges(model: bytes, data: list[np.ndarray]) -> dict[str, tuple[float, float]]:
    """Every tensor's [min, max] over ``data`` (what a calibrator records), from ORT's CPU EP."""
    m = onnx.load_from_string(model)
    names = [o for n in m.graph.node for o in n.output]
    m.graph.output.extend(oh.make_empty_tensor_value_info(n) for n in names if n != "y")
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = [sess.run(names, {"x": x}) for x in data]
    ranges = {"x": (float(min(x.min() for x in data)), float(max(x.max() for x in data)))}
    for i, n in enumerate(names):
        ranges[n] = (float(min(o[i].min() for o in outs)), float(max(o[i].max() for o in outs)))
    return ranges


def write_ort_json(path, ranges: dict[str, tuple[float, float]]) -> None:
    """The JSON onnxruntime.quantization's write_calibration_table writes (numpy-encoded TensorsData)."""

    def arr(v: float) -> dict:
        return {"data": [v], "dtype": "float32", "CLS": "numpy.array"}

    data = {n: {"lowest": arr(lo), "highest": arr(hi), "CLS": "TensorData"} for n, (lo, hi) in ranges.items()}
    doc = {
        "CLS": "TensorsData",
        "data": data,
        "calibration_method": {"CLS": "CalibrationMethod", "value": "x"},
    }
    path.write_text(json.dumps(doc, indent=1))


def write_native(path, ranges: dict[str, tuple[float, float]]) -> None:
    lines = ["TRT-8601-EntropyCalibration2"]
    for n, (lo, hi) in ranges.items():
        bits = struct.unpack(">I", struct.pack(">f", max(abs(lo), abs(hi)) / 127.0))[0]
        lines.append(f"{n}: {bits:08x}")
    path.write_text("\n".join(lines) + "\n")


# -- table formats -------------------------------------------------------------------------------------
def test_onnxruntime_quantization_tables_parse(tmp_path):
    """The files onnxruntime.quantization itself writes: calibration.json and calibration.flatbuffers."""
    from onnxruntime.quantization.calibrate import CalibrationDataReader, create_calibrator
    from onnxruntime.quantization.quant_utils import write_calibration_table

    model = tmp_path / "m.onnx"
    model.write_bytes(conv_mlp())
    data = inputs()

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter({"x": x} for x in data)

        def get_next(self):
            return next(self.it, None)

    cal = create_calibrator(str(model), [], augmented_model_path=str(tmp_path / "aug.onnx"))
    cal.collect_data(Reader())
    write_calibration_table(cal.compute_data(), dir=str(tmp_path))
    want = tensor_ranges(model.read_bytes(), data)
    table = read_table(str(tmp_path / "calibration.json"), native=False)
    assert table.format == "json" and set(table.ranges) >= {"x", "c", "r", "f", "m"}
    for n in ("x", "r", "m"):
        assert table.ranges[n] == pytest.approx(max(abs(v) for v in want[n]), rel=1e-6)
    fb = read_table(str(tmp_path / "calibration.flatbuffers"), native=False)
    assert fb.format == "flatbuffers" and set(fb.ranges) == set(table.ranges)
    assert fb.ranges["r"] == pytest.approx(table.ranges["r"], rel=1e-6)  # relu output: max == abs-max


def test_json_forms_and_native_parse(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"a": [-2.0, 1.0], "b": {"lowest": 0.0, "highest": 3.0}}))
    assert read_table(str(plain), native=False).ranges == {"a": 2.0, "b": 3.0}
    native = tmp_path / "cal.txt"
    native.write_text("TRT-8601-EntropyCalibration2\ninput:0: 3c010204\n\nb: 3f800000\n")
    t = read_table(str(native), native=True)
    assert t.format == "native" and set(t.ranges) == {"input:0", "b"}  # ':' inside a tensor name
    assert t.ranges["b"] == pytest.approx(127.0) and t.ranges["input:0"] == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize(
    "native,text,where,what",
    [
        (True, "TRT-8601-EntropyCalibration2\na: 3c010204\nb 3c010204\n", ":3:", "expected 'tensor_name"),
        (True, "TRT-8601-EntropyCalibration2\na: 3c01020g\n", ":2:", "not 1-8 hex digits"),
        (True, "TRT-8601-EntropyCalibration2\na: 7fc00000\n", ":2:", "not a finite"),
        (True, "TRT-8601-EntropyCalibration2\na: 1\na: 2\n", ":3:", "listed again (first on line 2)"),
        (True, '{"a": [0, 1]}', ":1:", "not a TensorRT-style"),
        (False, '{\n "a": [0, 1],\n "b": [0, 1\n}', ":4:", "not valid JSON"),
        (False, '{\n "a": [0, 1],\n "b": [2, 1]\n}', ":3: tensor 'b'", "not a finite [lowest, highest]"),
        (False, '{\n "a": [0, 1],\n "b": "big"\n}', ":3: tensor 'b'", "expected [min, max]"),
        (
            False,
            "TRT-8601-EntropyCalibration2\na: 1\n",
            "",
            "needs migraphx_int8_use_native_calibration_table=1",
        ),
    ],
)
def test_malformed_tables_name_file_and_line(tmp_path, native, text, where, what):
    path = tmp_path / "table"
    path.write_text(text)
    with pytest.raises(CalibrationError) as e:
        read_table(str(path), native)
    assert f"{path}{where}" in str(e.value) and what in str(e.value)


def test_missing_table_option_and_file_are_errors(tmp_path):
    with pytest.raises(
        CalibrationError, match="migraphx_int8_enable=1 needs migraphx_int8_calibration_table_name"
    ):
        load_table(parse_options({"migraphx_int8_enable": "1"}, {}))
    with pytest.raises(
        CalibrationError, match="migraphx_fp8_enable=1 needs migraphx_int8_calibration_table_name"
    ):
        load_table(parse_options({"migraphx_fp8_enable": "1"}, {}))
    name = str(tmp_path / "nope.json")
    with pytest.raises(
        CalibrationError, match="migraphx_int8_calibration_table_name=.*nope.json.*no such file"
    ):
        load_table(
            parse_options({"migraphx_int8_enable": "1", "migraphx_int8_calibration_table_name": name}, {})
        )
    with pytest.raises(OptionError, match="cannot both"):
        parse_options({"migraphx_int8_enable": "1", "migraphx_fp8_enable": "1"}, {})
    # Through a real session: the error reaches the user, naming the option.
    with pytest.raises(Exception, match="migraphx_int8_calibration_table_name"):
        ort.InferenceSession(
            conv_mlp(),
            providers=[(EP, {"migraphx_target": "ref", "migraphx_int8_enable": "1"}), "CPUExecutionProvider"],
        )


def test_table_contents_change_the_cache_key(tmp_path):
    path = tmp_path / "cal.json"
    opts = {"migraphx_int8_enable": "1", "migraphx_int8_calibration_table_name": str(path)}
    graph = {"nodes": [], "inputs": ["x"], "outputs": ["x"], "values": {}, "initializers": {}}
    fp = graph_fingerprint(graph)
    keys = []
    for hi in (1.0, 2.0, 1.0):
        path.write_text(json.dumps({"x": [0.0, hi]}))
        o = parse_options(opts, {})
        o = type(o)(**{**o.__dict__, "calibration_digest": load_table(o).digest})
        keys.append(program_key(fp, [[2, 3]], None, o, "ref"))
    assert keys[0] != keys[1] and keys[0] == keys[2]
    plain = parse_options({}, {})
    assert program_key(fp, [[2, 3]], None, plain, "ref") not in keys


# -- through real ORT sessions -------------------------------------------------------------------------
def compiled_ops(backend) -> list[str]:
    progs = [p for c in backend.eps[-1].compiled for p in c.programs.values()]
    return [i.name for p in progs for i in p.get_main_module().instructions]


@pytest.mark.parametrize(
    "mode,writer", [("int8", write_ort_json), ("int8", write_native), ("fp8", write_ort_json)]
)
# With fp16 too: fp8 products accumulate in float32 far past fp16's range, so the accumulator's
# dequantising scale must stay float32 (converted first, every output was inf or NaN).
@pytest.mark.parametrize("fp16", ["0", "1"], ids=["", "fp16"])
def test_quantised_session_is_close_to_fp32_and_runs_quantised_ops(tmp_path, recording, mode, writer, fp16):
    # Its own generator: the model and data do not depend on which tests ran first (with the shared
    # one, an unlucky draw once put int8 at 9.9%; seeds 0-5 measure int8 1.4-3.2%, fp8 5-10%, fp16
    # adding at most 0.6 points).
    rng = np.random.default_rng(3)
    model = conv_mlp(rng)
    table = tmp_path / "cal.table"
    writer(table, tensor_ranges(model, inputs(8, rng)))
    opts = {
        "migraphx_target": "ref",
        f"migraphx_{mode}_enable": "1",
        "migraphx_int8_calibration_table_name": str(table),
        "migraphx_int8_use_native_calibration_table": "1" if writer is write_native else "0",
        "migraphx_fp16_enable": fp16,
    }
    sess = ort.InferenceSession(model, providers=[(EP, opts), "CPUExecutionProvider"])
    cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    ops = compiled_ops(recording)
    assert "quant_convolution" in ops and "quant_dot" in ops
    assert "convolution" not in ops and "dot" not in ops
    tol = INT8_TOLERANCE if mode == "int8" else FP8_TOLERANCE
    for x in inputs(3, rng):
        got, want = sess.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0]
        err = np.abs(got - want).max() / np.abs(want).max()
        assert 0 < err < tol, err  # quantised (not bit-equal to fp32), and close


def test_tensor_missing_from_table_falls_back_with_a_warning(tmp_path, recording, caplog):
    model = conv_mlp()
    ranges = tensor_ranges(model, inputs(8))
    # The MatMul reads f = flatten(r): a range for r would serve (flatten keeps ranges), so drop both.
    del ranges["f"], ranges["r"]
    table = tmp_path / "cal.json"
    write_ort_json(table, ranges)
    opts = {
        "migraphx_target": "ref",
        "migraphx_int8_enable": "1",
        "migraphx_int8_calibration_table_name": str(table),
    }
    with caplog.at_level(logging.WARNING, logger="migraphx_ep"):
        sess = ort.InferenceSession(model, providers=[(EP, opts), "CPUExecutionProvider"])
    assert "has no range for 'f'" in caplog.text and "generated inputs" in caplog.text
    assert "quant_dot" in compiled_ops(recording)
    x = inputs(1)[0]
    assert np.isfinite(sess.run(None, {"x": x})[0]).all()
