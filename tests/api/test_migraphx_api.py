"""The MIGraphX Python API facade: every entry point, used the way MIGraphX's own examples use it."""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import migraphx_ep.migraphx as migraphx
from migraphx_ep.frontend import ParseError
from migraphx_ep.ir import Shape

RNG = np.random.default_rng(3)


def test_shape_methods():
    s = migraphx.shape(type="float_type", lens=[2, 3])
    assert s.type() == 2 and isinstance(s.type(), int) and s.type_string() == "float_type"
    assert s.lens() == [2, 3] and s.strides() == [3, 1] and s.elements() == 6 and s.ndim() == 2
    assert s.bytes() == 24 and s.type_size() == 4
    assert s.packed() and s.standard() and not s.transposed() and not s.broadcasted() and not s.scalar()
    assert not s.dynamic() and [(d.min, d.max) for d in s.dyn_dims()] == [(2, 2), (3, 3)]
    assert migraphx.shape(type=2, lens=[2, 3]) == s == migraphx.shape(type="float", lens=[2, 3])
    assert migraphx.shape(type=migraphx.shape.type_t.float_type, lens=[2, 3]) == s
    assert migraphx.shape(type=np.float32, lens=[2, 3]) == s
    assert hash(s) == hash(migraphx.shape(type=2, lens=[2, 3]))
    t = migraphx.shape(type="half_type", lens=[2, 3], strides=[1, 2])
    assert t.transposed() and not t.standard() and t.packed() and t.type() == 1 and t.bytes() == 12
    b = migraphx.shape(type="int64_type", lens=[4, 3], strides=[0, 1])
    assert b.broadcasted() and not b.packed() and b.bytes() == 24
    assert migraphx.shape(type="float_type", lens=[3], strides=[0]).scalar()
    dd = [migraphx.dynamic_dimension(1, 4, {2, 4}), migraphx.dynamic_dimension(3, 3)]
    d = migraphx.shape(type="float_type", dyn_dims=dd)
    assert d.dynamic() and d.dyn_dims() == dd and d.min_lens() == [1, 3] and d.max_lens() == [4, 3]
    assert not dd[0].is_fixed() and dd[1].is_fixed() and dd[0].optimals == {2, 4}
    assert repr(s) == "float_type, {2, 3}, {3, 1}"
    with pytest.raises(TypeError, match="unknown element type"):
        migraphx.shape(type="quux_type", lens=[1])


def test_argument_from_buffers():
    a = RNG.standard_normal((2, 3)).astype(np.float32)
    arg = migraphx.argument(a)
    assert arg.get_shape() == migraphx.shape(type="float_type", lens=[2, 3])
    assert arg.tolist() == a.ravel().tolist() and arg.data_ptr() == a.ctypes.data  # no copy
    np.testing.assert_array_equal(np.array(arg), a)
    assert migraphx.argument(a.copy()) == arg and migraphx.argument(a + 1) != arg
    assert migraphx.argument(a.astype(np.float64)) != arg  # same values, different type
    assert migraphx.argument(memoryview(np.arange(4, dtype=np.int32))).get_shape().type() == 8
    assert migraphx.argument(b"\x01\x02").tolist() == [1, 2]
    z = migraphx.argument(migraphx.shape(type="int64_type", lens=[3]))
    assert z.tolist() == [0, 0, 0] and z.get_shape().type() == 9
    assert str(migraphx.argument(np.array([1, 2], np.int8))) == "1, 2"
    t = migraphx.argument(a.T)  # a transposed view becomes a standard argument
    assert t.get_shape().lens() == [3, 2] and t.tolist() == a.T.ravel().tolist()


@pytest.mark.parametrize(
    "type_name",
    [
        "float_type",
        "half_type",
        "bf16_type",
        "fp8e4m3fn_type",
        "int32_type",
        "uint8_type",
        "int64_type",
        "bool_type",
    ],
)
def test_generate_argument_deterministic(type_name):
    s = migraphx.shape(type=type_name, lens=[4, 5])
    a, b = migraphx.generate_argument(s, 1), migraphx.generate_argument(s, 1)
    c = migraphx.generate_argument(s, 2)
    assert a == b and a.get_shape() == s
    assert np.array(a).tobytes() != np.array(c).tobytes()
    v = np.array(a).astype(np.float64)
    assert len(np.unique(v)) > 1 and v.min() >= -8 and v.max() < 16


def test_generate_fill_create_strided():
    s = migraphx.shape(type="float_type", lens=[2, 3], strides=[1, 2])
    g = migraphx.generate_argument(s, 5)
    assert g.get_shape() == s and g.tolist() == migraphx.generate_argument(s, 5).tolist()
    f = migraphx.fill_argument(s, 2.5)
    assert f.get_shape() == s and f.tolist() == [2.5] * 6
    c = migraphx.create_argument(s, [1, 2, 3, 4, 5, 6])
    assert c.get_shape() == s and c.tolist() == [1, 2, 3, 4, 5, 6]
    i8 = migraphx.shape(type="int8_type", lens=[3])
    assert migraphx.create_argument(i8, [1, -2, 3]).tolist() == [1, -2, 3]
    with pytest.raises(ValueError, match="3 values for a shape of 6"):
        migraphx.create_argument(s, [1, 2, 3])


@pytest.mark.parametrize("type_name", ["fp8e5m2_type", "fp8e4m3fn_type", "bf16_type", "bool_type"])
def test_strided_arguments_of_narrow_types(type_name):
    # A transposed argument of float8_e5m2 used to raise TypeError from as_strided: ml_dtypes reports its
    # typestr as "<f1", which numpy cannot read back (ir/dtypes.strided_view works around it).
    s = migraphx.shape(type=type_name, lens=[2, 3], strides=[1, 2])
    g = migraphx.generate_argument(s, 5)
    assert g.get_shape() == s and g.tolist() == migraphx.generate_argument(s, 5).tolist()
    f = migraphx.fill_argument(s, 1)
    assert f.get_shape() == s and [float(v) for v in f.tolist()] == [1.0] * 6


def test_strided_view_matches_as_strided():
    import ml_dtypes

    from migraphx_ep.ir.dtypes import strided_view

    base = np.arange(12, dtype=np.float32)
    want = np.lib.stride_tricks.as_strided(base, (3, 2), (8, 4))
    for dt in (np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fnuz):
        a = base.astype(dt)
        got = strided_view(a, (3, 2), (2 * a.itemsize, a.itemsize), writeable=False)
        assert got.dtype == a.dtype and not got.flags.writeable
        np.testing.assert_array_equal(got.astype(np.float32), want)


def test_argument_from_pointer_is_zero_copy():
    buf = np.arange(6, dtype=np.float32)
    s = migraphx.shape(type="float_type", lens=[2, 3])
    arg = migraphx.argument_from_pointer(s, buf.ctypes.data)
    assert arg.data_ptr() == buf.ctypes.data and arg.tolist() == [0, 1, 2, 3, 4, 5]
    buf[4] = 40.0
    assert arg.tolist()[4] == 40.0
    np.asarray(arg)[0, 0] = -1.0
    assert buf[0] == -1.0
    raw = (ctypes.c_int16 * 6)(*range(6))
    t = migraphx.argument_from_pointer(
        migraphx.shape(type="int16_type", lens=[3, 2], strides=[1, 3]), ctypes.addressof(raw)
    )
    assert t.tolist() == [0, 3, 1, 4, 2, 5]
    with pytest.raises(ValueError, match="null"):
        migraphx.argument_from_pointer(s, 0)


def test_targets():
    assert migraphx.get_target("ref").name == "ref"
    try:
        assert migraphx.get_target("gpu").name == "gpu"  # where a GPU target exists
    except migraphx.TargetError as e:
        assert "gpu" in str(e)
    with pytest.raises(migraphx.TargetError, match="unknown target"):
        migraphx.get_target("fpga")


def build_program() -> migraphx.program:
    p = migraphx.program()
    m = p.get_main_module()
    s = migraphx.shape(type="float_type", lens=[2, 3])
    x = m.add_parameter("x", s)
    y = m.add_parameter("y", s)
    w = m.add_literal(np.full((2, 3), 3.0, np.float32))
    a = m.add_instruction(migraphx.op("add"), [x, y])
    b = m.add_instruction(migraphx.op("mul"), [a, w])
    c = m.add_instruction(migraphx.op("convert", target_type="half_type"), [b])
    m.add_return([b, c])
    return p


def test_program_build_compile_run():
    p = build_program()
    assert p.get_parameter_names() == ["x", "y"]
    assert p.get_parameter_shapes() == {
        "x": migraphx.shape(type="float_type", lens=[2, 3]),
        "y": migraphx.shape(type="float_type", lens=[2, 3]),
    }
    assert p.get_output_shapes() == [
        migraphx.shape(type="float_type", lens=[2, 3]),
        migraphx.shape(type="half_type", lens=[2, 3]),
    ]
    q = p.clone()
    assert q == p and "mul" in str(p) and "@param:x" in str(p.get_main_module())
    p.compile(migraphx.get_target("ref"), offload_copy=True, fast_math=False, exhaustive_tune=False)
    assert p.is_compiled() and not q.is_compiled()
    x, y = RNG.standard_normal((2, 3)).astype(np.float32), RNG.standard_normal((2, 3)).astype(np.float32)
    out = p.run({"x": migraphx.argument(x), "y": y})
    assert isinstance(out, list) and all(isinstance(o, migraphx.argument) for o in out)
    np.testing.assert_array_equal(np.array(out[0]), (x + y) * 3)
    assert out[1].get_shape().type_string() == "half_type"
    np.testing.assert_array_equal(np.array(out[1]), ((x + y) * 3).astype(np.float16))
    assert [a.tolist() for a in q.run({"x": x, "y": y})] == [a.tolist() for a in out]  # clone runs uncompiled


def test_module_api_submodules_and_sort(capsys):
    p = migraphx.program()
    m = p.get_main_module()
    s = migraphx.shape(type="float_type", lens=[3])
    cond = m.add_parameter("c", migraphx.shape(type="bool_type", lens=[1]))
    x = m.add_parameter("x", s)
    then_m, else_m = p.create_module("then"), p.create_module("else")
    then_m.add_return([then_m.add_instruction(migraphx.op("neg"), [then_m.add_parameter("t", s)])])
    else_m.add_return([else_m.add_instruction(migraphx.op("exp"), [else_m.add_parameter("e", s)])])
    f = m.add_instruction(migraphx.op("if"), [cond, x, x], [then_m, else_m])
    m.add_return([m.add_instruction(migraphx.op("get_tuple_elem", index=0), [f])])
    xv = np.array([0.5, -1.0, 2.0], np.float32)
    np.testing.assert_array_equal(np.array(p.run({"c": np.array([True]), "x": xv})[0]), -xv)
    np.testing.assert_array_equal(np.array(p.run({"c": np.array([False]), "x": xv})[0]), np.exp(xv))
    then_m.print()
    assert "neg" in capsys.readouterr().out
    assert then_m.name() == "then" and then_m.get_parameter_names() == ["t"]
    # sort: move the return's producer to the front, then restore a topological order.
    ir = p.ir.get_main_module()
    ir.instructions.insert(0, ir.instructions.pop(-2))
    p.sort()
    ir.validate()


def test_op_errors():
    with pytest.raises(ValueError, match="unknown operator"):
        migraphx.op("no_such_op")
    with pytest.raises(ValueError, match="unknown attribute"):
        migraphx.op("add", axis=1)
    assert migraphx.op("multibroadcast", out_lens=[2, 3]).out_lens == (2, 3)


def test_quantize_entry_points():
    p = build_program()
    migraphx.quantize_fp16(p)
    assert "half_type" in str(p) and p.get_parameter_shapes()["x"].type_string() == "float_type"
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(np.array(p.run({"x": x, "y": x})[0]), np.full((2, 3), 6.0, np.float32))
    f8 = migraphx.program()
    m = f8.get_main_module()
    m.add_return(
        [
            m.add_instruction(
                migraphx.op("neg"), [m.add_parameter("a", migraphx.shape(type="fp8e4m3fn_type", lens=[2]))]
            )
        ]
    )
    migraphx.autocast_fp8(f8)
    assert f8.get_parameter_shapes()["a"].type_string() == "float_type"
    assert f8.get_output_shapes()[0].type_string() == "float_type"
    out = f8.run({"a": np.array([1.5, -3.0], np.float32)})
    np.testing.assert_array_equal(np.array(out[0]), [-1.5, 3.0])
    assert np.array(out[0]).dtype == np.float32
    assert ml_dtypes.float8_e4m3fn  # the fp8 type exists in this environment


def small_model(path, unknown: bool = False, sym: bool = True) -> None:
    dim = "N" if sym else 2
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim, 3])
    w = numpy_helper.from_array(np.arange(1, 4, dtype=np.float32).reshape(1, 3), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["a"], name="mul0")]
    if unknown:
        nodes.append(helper.make_node("Frob", ["a"], ["f"], name="frob0", domain="my.custom"))
    nodes.append(helper.make_node("Exp", ["f" if unknown else "a"], ["z"], name="exp0"))
    vi = [helper.make_tensor_value_info("f", TensorProto.FLOAT, [dim, 3])] if unknown else []
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [dim, 3])
    g = helper.make_graph(nodes, "g", [x], [z], [w], value_info=vi)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("my.custom", 1)] if unknown else [])
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 8
    onnx.save(m, str(path))


def test_parse_onnx_dims(tmp_path):
    path = tmp_path / "m.onnx"
    small_model(path)
    assert migraphx.parse_onnx(str(path)).get_parameter_shapes()["x"].lens() == [1, 3]
    assert migraphx.parse_onnx(path, default_dim_value=4).get_parameter_shapes()["x"].lens() == [4, 3]
    p = migraphx.parse_onnx(path, map_input_dims={"x": [5, 3]})
    assert p.get_parameter_shapes()["x"].lens() == [5, 3]
    xv = RNG.standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(np.array(p.run({"x": xv})[0]), np.exp(xv * [1, 2, 3]), rtol=1e-6)
    fixed = migraphx.parse_onnx(path, default_dyn_dim_value=migraphx.dynamic_dimension(6, 6))
    assert fixed.get_parameter_shapes()["x"].lens() == [6, 3]
    dd = migraphx.parse_onnx(
        path, map_dyn_input_dims={"x": [migraphx.dynamic_dimension(2, 2), migraphx.dynamic_dimension(3, 3)]}
    )
    assert dd.get_parameter_shapes()["x"].lens() == [2, 3]
    with pytest.raises(ValueError, match="no model input named"):
        migraphx.parse_onnx(path, map_input_dims={"nope": [1]})
    with pytest.raises(ValueError, match="rank 2"):
        migraphx.parse_onnx(path, map_input_dims={"x": [1, 2, 3]})
    buf = migraphx.parse_onnx_buffer(path.read_bytes(), map_input_dims={"x": [5, 3]})
    assert buf == p


def test_parse_onnx_unknown_operators(tmp_path, capsys):
    path = tmp_path / "u.onnx"
    small_model(path, unknown=True, sym=False)
    with pytest.raises(ParseError, match=r"Frob\(frob0\)"):
        migraphx.parse_onnx(path)
    with pytest.raises(ParseError):
        migraphx.parse_onnx(path, print_program_on_error=True)
    assert "mul" in capsys.readouterr().err  # the part parsed before the error
    with pytest.warns(RuntimeWarning, match="1 node"):
        p = migraphx.parse_onnx(path, skip_unknown_operators=True)
    assert sorted(p.get_parameter_names()) == ["f", "x"]
    fv = RNG.standard_normal((2, 3)).astype(np.float32)
    out = p.run({"x": np.zeros((2, 3), np.float32), "f": fv})
    np.testing.assert_allclose(np.array(out[0]), np.exp(fv), rtol=1e-6)
    with pytest.raises(ParseError, match="cannot read"):
        migraphx.parse_onnx(tmp_path / "missing.onnx")


def test_parse_tf_refused():
    with pytest.raises(NotImplementedError, match="parse_onnx"):
        migraphx.parse_tf("model.pb")


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
def test_load_save(tmp_path, fmt):
    p = build_program()
    path = str(tmp_path / "p.mxr")
    migraphx.save(p, path, format=fmt)
    q = migraphx.load(path, format=fmt)
    assert isinstance(q, migraphx.program) and q == p
    p.compile(migraphx.get_target("ref"))
    migraphx.save(p, path, format=fmt)
    c = migraphx.load(path, format=fmt)
    assert c.is_compiled()
    x = np.ones((2, 3), np.float32)
    assert [a.tolist() for a in c.run({"x": x, "y": x})] == [a.tolist() for a in p.run({"x": x, "y": x})]
    assert isinstance(p.ir.get_main_module().instructions[0].shape, Shape)


def test_parse_onnx_unsupported_input_type():
    x = helper.make_tensor_value_info("x", TensorProto.STRING, [2])
    z = helper.make_tensor_value_info("z", TensorProto.STRING, [2])
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "g", [x], [z])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    with pytest.raises(ParseError, match="'x'"):
        migraphx.parse_onnx_buffer(m.SerializeToString())
