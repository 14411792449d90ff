"""End-to-end tests of the C++ plugin shell and the name routing, through real onnxruntime, with the numpy
stub backend of conftest.py (no compiler core involved). Placement is proven with ORT profiles."""

from __future__ import annotations

import gc
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import threading

import numpy as np
import onnx.numpy_helper as nh
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

import migraphx_ep
from conftest import (
    BF16,
    EP,
    B,
    C,
    chain_expected,
    chain_model,
    make_model,
    node_providers,
    ones,
    profiled_options,
    ran_on,
    tensor,
)
from migraphx_ep import _routing


# --- the library itself -------------------------------------------------------------------------
def test_library_exports_only_plugin_entry_points():
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not installed")
    out = subprocess.run(
        [nm, "-D", "--defined-only", migraphx_ep.get_library_path()],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    funcs = {line.split()[-1] for line in out.splitlines() if line.split()[1:2] == ["T"]}
    assert funcs == {"CreateEpFactories", "ReleaseEpFactory", "PyInit__C"}


def test_package_metadata_and_device():
    assert migraphx_ep.get_ep_name() == EP and migraphx_ep.get_ep_names() == [EP]
    assert os.path.isabs(migraphx_ep.get_library_path())
    dev = migraphx_ep.get_ep_device()
    assert (dev.ep_name, dev.ep_vendor) == (EP, "migraphx-ep")
    assert dev.device.type == ort.OrtHardwareDeviceType.CPU
    assert dict(dev.ep_metadata)["version"] == migraphx_ep.__version__
    assert EP in ort.get_available_providers()


# --- routing forms -------------------------------------------------------------------------------
def _session_string(model, so):
    return ort.InferenceSession(model, so, providers=[EP]), {}


def _session_tuple(model, so):
    return ort.InferenceSession(
        model, so, providers=[(EP, {"device_id": 0, "Fp16": True}), "CPUExecutionProvider"]
    ), {"device_id": "0", "Fp16": "True"}


def _session_provider_options(model, so):
    sess = ort.InferenceSession(
        model, so, providers=[EP, "CPUExecutionProvider"], provider_options=[{"migraphx_target": "ref"}, {}]
    )
    return sess, {"migraphx_target": "ref"}


def _session_plain_c_api(model, so):
    # The standard plugin-EP recipe, unchanged; registering again after import is tolerated.
    ort.register_execution_provider_library(EP, migraphx_ep.get_library_path())
    dev = [d for d in ort.get_ep_devices() if d.ep_name == EP][0]
    so.add_provider_for_devices([dev], {"plain": "yes"})
    return ort.InferenceSession(model, so), {"plain": "yes"}


@pytest.mark.parametrize(
    "make",
    [_session_string, _session_tuple, _session_provider_options, _session_plain_c_api],
    ids=["string", "tuple", "provider_options", "plain_c_api"],
)
def test_routing_forms_run_on_ep(stub, make):
    model = chain_model()
    sess, expected_options = make(model, profiled_options())
    assert stub.options == [expected_options]
    assert sess.get_providers()[0] == EP
    x = np.random.default_rng(0).standard_normal((4, C)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, chain_expected(x), rtol=1e-6)
    cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(y, cpu.run(None, {"x": x})[0], rtol=1e-6)
    assert EP in ran_on(sess)
    assert stub.runs == 1


def test_without_our_name_ort_is_untouched(stub):
    sess = ort.InferenceSession(chain_model(), profiled_options(), providers=["CPUExecutionProvider"])
    sess.run(None, {"x": ones()})
    assert stub.options == [] and ran_on(sess) == {"CPUExecutionProvider"}


def test_unavailable_companion_provider_is_skipped_like_ort_does(stub):
    with pytest.warns(UserWarning, match="'NoSuchExecutionProvider' is not in available provider names"):
        sess = ort.InferenceSession(chain_model(), providers=[EP, "NoSuchExecutionProvider"])
    assert sess.get_providers() == [EP, "CPUExecutionProvider"]


def test_user_session_options_reuse(stub):
    so = ort.SessionOptions()
    for _ in range(2):  # same providers again: not attached twice
        sess = ort.InferenceSession(chain_model(), so, providers=[(EP, {"a": "1"})])
        np.testing.assert_allclose(sess.run(None, {"x": ones()})[0], chain_expected(ones()))
    assert stub.options == [{"a": "1"}, {"a": "1"}]
    with pytest.raises(_routing.RoutingError, match="cannot be copied"):
        ort.InferenceSession(chain_model(), so, providers=[(EP, {"a": "2"})])


# --- graph marshalling ----------------------------------------------------------------------------
def test_graph_dict(stub):
    sess = ort.InferenceSession(chain_model(), providers=[EP])  # views of ORT memory: keep the session
    g = stub.graphs[0]
    assert g["inputs"] == ["x"] and g["outputs"] == ["y"] and g["opsets"][""] == 17
    assert g["values"]["x"] == {"dtype": TP.FLOAT, "shape": ["N", C]}
    ops = {n["op_type"]: n for n in g["nodes"]}
    assert (ops["Add"]["inputs"], ops["Add"]["domain"], ops["Add"]["since_version"]) == (["x", "w"], "", 14)
    b = g["initializers"]["b"]
    assert b.dtype == np.float32 and not b.flags.writeable and not b.flags.owndata  # a view of ORT's memory
    np.testing.assert_array_equal(b, B)
    compiled = stub.compiled[0].graph
    # Compile's inputs follow the fused node's, constant initializers included.
    assert compiled["inputs"] == ["x", "w", "b"] and compiled["outputs"] == ["y"]
    assert set(compiled["initializers"]) == {"w", "b"}
    del sess


def test_graph_dict_attributes_subgraphs_and_strings(stub):
    then_g = oh.make_graph([oh.make_node("Relu", ["l"], ["t"])], "then", [], [tensor("t", TP.FLOAT, None)])
    else_g = oh.make_graph([oh.make_node("Neg", ["l"], ["e"])], "else", [], [tensor("e", TP.FLOAT, None)])
    nodes = [
        oh.make_node("LeakyRelu", ["x"], ["l"], alpha=0.25, name="leaky"),
        oh.make_node("Transpose", ["l"], ["tp"], perm=[1, 0], name="tr"),
        oh.make_node("ConstantOfShape", ["shp"], ["c"], value=nh.from_array(np.array([1.5], np.float32))),
        oh.make_node("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g, name="if"),
        oh.make_node("Identity", ["s"], ["so"], name="strings"),
    ]
    ins = [("x", TP.FLOAT, None), ("shp", TP.INT64, [2]), ("cond", TP.BOOL, []), ("s", TP.STRING, [2])]
    outs = [("tp", TP.FLOAT, None), ("c", TP.FLOAT, None), ("z", TP.FLOAT, None), ("so", TP.STRING, None)]
    model = make_model(nodes, [tensor(*i) for i in ins], [tensor(*o) for o in outs], check=False)
    sess = ort.InferenceSession(model, profiled_options(), providers=[EP])
    main = next(g for g in stub.graphs if any(n["op_type"] == "If" for n in g["nodes"]))
    assert main["values"]["x"] == {"dtype": TP.FLOAT, "shape": None}  # rank unknown, not a scalar
    assert main["values"]["s"]["dtype"] == TP.STRING
    ops = {n["op_type"]: n for n in main["nodes"]}
    assert ops["LeakyRelu"]["attributes"] == {"alpha": 0.25}
    assert ops["Transpose"]["attributes"] == {"perm": [1, 0]}
    value = ops["ConstantOfShape"]["attributes"]["value"]
    assert isinstance(value, np.ndarray) and value.tolist() == [1.5]
    assert ops["If"]["attributes"] == {"then_branch": "<graph>", "else_branch": "<graph>"}
    assert ops["If"]["implicit_inputs"] == ["l"]
    then_body = ops["If"]["subgraphs"]["then_branch"]
    assert then_body["outputs"] == ["t"] and "l" in then_body["values"]  # "l": from the outer scope
    # ORT also asks about each body on its own (before fusing the Relu we claimed in it).
    assert any([n["op_type"] for n in g["nodes"]] == ["Relu"] and g["outputs"] == ["t"] for g in stub.graphs)
    x = np.array([[-1.0, 2.0]], np.float32)
    feeds = {"x": x, "shp": np.array([2, 2]), "s": np.array(["a", "b"], object)}
    tp, c, z, so = sess.run(None, {**feeds, "cond": np.array(True)})
    leaky = np.where(x > 0, x, 0.25 * x)
    np.testing.assert_allclose(tp, leaky.T)
    np.testing.assert_allclose(c, np.full((2, 2), 1.5))
    np.testing.assert_allclose(z, np.maximum(leaky, 0))  # the Relu inside the If body ran on our EP
    assert so.tolist() == ["a", "b"]
    np.testing.assert_allclose(sess.run(["z"], {**feeds, "cond": np.array(False)})[0], -leaky)
    assert EP in ran_on(sess)


def test_string_and_packed_tensors_are_unsupported_markers():
    from migraphx_ep.ep import bridge

    assert bridge.make_array(None, TP.STRING, [2]) == bridge.Unsupported("string tensor")
    assert isinstance(bridge.make_array(b"\x00", TP.INT4, [2]), bridge.Unsupported)
    arr = bridge.make_array(memoryview(np.arange(4, dtype=np.int32).tobytes()), TP.INT32, [2, 2])
    assert arr.tolist() == [[0, 1], [2, 3]] and not arr.flags.writeable


def test_external_data_initializers_are_memory_mapped(stub, tmp_path):
    import onnx

    path = tmp_path / "model.onnx"
    onnx.save(
        onnx.load_from_string(chain_model()),
        path,
        save_as_external_data=True,
        location="weights.bin",
        size_threshold=0,
    )
    sess = ort.InferenceSession(str(path), providers=[EP])
    inits = stub.compiled[0].graph["initializers"]
    assert isinstance(inits["b"].base, np.memmap) and not inits["b"].flags.writeable
    x = ones(3) * 0.25
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], chain_expected(x))


def test_missing_default_backend_is_a_clear_error(monkeypatch):
    from migraphx_ep.ep import bridge

    bridge.set_backend(None)
    monkeypatch.setattr(bridge, "DEFAULT_BACKEND", "migraphx_ep.ep.no_such_backend")
    with pytest.raises(Exception, match="ImportError: migraphx_ep: the default EP backend module"):
        ort.InferenceSession(chain_model(), providers=[EP])


def test_get_capability_exception_falls_back_to_cpu(stub, monkeypatch):
    def boom(self, graph):
        raise KeyError("capability failed")

    monkeypatch.setattr(type(stub.create_ep({})), "get_capability", boom)
    sess = ort.InferenceSession(chain_model(), profiled_options(), providers=[EP])
    np.testing.assert_allclose(sess.run(None, {"x": ones()})[0], chain_expected(ones()))
    assert ran_on(sess) == {"CPUExecutionProvider"}  # ORT only logs GetCapability errors


def test_release_on_session_end(stub):
    sess = ort.InferenceSession(chain_model(), providers=[EP])
    compiled = stub.compiled[0]
    del sess
    gc.collect()
    assert compiled.released and stub.released_eps == 1


# --- errors surface as ORT exceptions ----------------------------------------------------------------
def test_compile_exception_surfaces(stub):
    stub.fail_compile = True
    with pytest.raises(Exception, match="ValueError: stub compile refused: boom") as info:
        ort.InferenceSession(chain_model(), providers=[EP])
    assert EP in str(info.value)
    stub.fail_compile = False  # the process and the library are fine afterwards
    sess = ort.InferenceSession(chain_model(), providers=[EP])
    np.testing.assert_allclose(sess.run(None, {"x": ones() * 0})[0], chain_expected(ones() * 0))


def test_run_exception_surfaces(stub):
    sess = ort.InferenceSession(chain_model(), providers=[EP])
    stub.fail_run = True
    with pytest.raises(Exception, match="RuntimeError: stub run exploded: kaboom"):
        sess.run(None, {"x": ones()})
    stub.fail_run = False
    np.testing.assert_allclose(sess.run(None, {"x": ones()})[0], chain_expected(ones()))


def test_wrong_output_dtype_is_a_clear_error(stub, monkeypatch):
    sess = ort.InferenceSession(chain_model(), providers=[EP])
    monkeypatch.setattr(type(stub.compiled[0]), "run", lambda self, inputs: [np.zeros(inputs[0].shape)])
    with pytest.raises(Exception, match=r"output 0 \('y'\).*float64 but ORT expects float32"):
        sess.run(None, {"x": ones(2)})


# --- partitions, shapes, dtypes ---------------------------------------------------------------------
def test_unclaimed_node_in_the_middle(stub):
    # a = x + 1; s = a - 2 (Sub: not claimed); y = a * s. {Add, Mul} is not convex: two fused nodes.
    nodes = [
        oh.make_node("Add", ["x", "one"], ["a"], name="add"),
        oh.make_node("Sub", ["a", "two"], ["s"], name="sub"),
        oh.make_node("Mul", ["a", "s"], ["y"], name="mul"),
    ]
    inits = [nh.from_array(np.array(1, np.float32), "one"), nh.from_array(np.array(2, np.float32), "two")]
    model = make_model(nodes, [tensor("x", TP.FLOAT, [2, 2])], [tensor("y", TP.FLOAT, [2, 2])], inits)
    sess = ort.InferenceSession(model, profiled_options(), providers=[EP])
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], (x + 1) * (x - 1))
    placement = node_providers(sess)
    assert placement.get("sub_kernel_time") == "CPUExecutionProvider"
    assert sum(p == EP for p in placement.values()) == 2 and len(stub.compiled) == 2


def test_changed_input_shape_at_run(stub):
    sess = ort.InferenceSession(chain_model(), providers=[EP])
    for n in (1, 5, 2):
        x = ones(n) * n
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], chain_expected(x))
    assert len(stub.compiled) == 1


@pytest.mark.parametrize("shape", [(), (0, 3), (0,)], ids=["scalar", "empty2d", "empty1d"])
def test_scalar_and_empty_tensors(stub, shape):
    nodes = [oh.make_node("Add", ["x", "z"], ["y"]), oh.make_node("Relu", ["y"], ["r"])]
    model = make_model(
        nodes, [tensor("x", TP.FLOAT, shape), tensor("z", TP.FLOAT, shape)], [tensor("r", TP.FLOAT, shape)]
    )
    sess = ort.InferenceSession(model, profiled_options(), providers=[EP])
    x = np.full(shape, -1.5, np.float32)
    z = np.full(shape, 4.0, np.float32)
    (r,) = sess.run(None, {"x": x, "z": z})
    assert r.shape == shape and r.dtype == np.float32
    np.testing.assert_array_equal(r, np.maximum(x + z, 0))
    assert ran_on(sess) == {EP}


@pytest.mark.parametrize(
    "dtype",
    [np.float32, np.float16, np.int64, np.bool_, BF16],
    ids=["float32", "float16", "int64", "bool", "bfloat16"],
)
def test_dtype_round_trip(stub, dtype):
    dtype = np.dtype(dtype)
    elem = {np.float32: TP.FLOAT, np.float16: TP.FLOAT16, np.int64: TP.INT64, np.bool_: TP.BOOL}.get(
        dtype.type, TP.BFLOAT16
    )
    op = "And" if dtype == np.bool_ else "Add"
    model = make_model(
        [oh.make_node(op, ["a", "b"], ["c"])],
        [tensor("a", elem, [2, 3]), tensor("b", elem, [2, 3])],
        [tensor("c", elem, [2, 3])],
        opset=17,
    )
    sess = ort.InferenceSession(model, profiled_options(), providers=[EP])
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((2, 3)) * 4).astype(dtype)
    b = (rng.standard_normal((2, 3)) * 4).astype(dtype)
    if dtype == BF16:  # onnxruntime's numpy bridge has no bfloat16: bind uint16 buffers as bfloat16
        c = np.zeros((2, 3), dtype)
        binding = sess.io_binding()
        for name, arr in (("a", a), ("b", b)):
            binding.bind_ortvalue_input(
                name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(arr.view(np.uint16), elem)
            )
        binding.bind_ortvalue_output(
            "c", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(c.view(np.uint16), elem)
        )
        sess.run_with_iobinding(binding)
    else:
        (c,) = sess.run(None, {"a": a, "b": b})
    assert c.dtype == dtype
    np.testing.assert_array_equal(c, np.logical_and(a, b) if op == "And" else a + b)
    seen = stub.compiled[0].graph["values"]["a"]
    assert seen == {"dtype": elem, "shape": [2, 3]}
    assert ran_on(sess) == {EP}


def test_inputs_are_read_only_views(stub, monkeypatch):
    sess = ort.InferenceSession(chain_model(), providers=[EP])
    flags = []
    real_run = type(stub.compiled[0]).run

    def spy(self, inputs):
        flags.append([a.flags.writeable for a in inputs])
        return real_run(self, inputs)

    monkeypatch.setattr(type(stub.compiled[0]), "run", spy)
    sess.run(None, {"x": ones()})
    assert flags and not any(flags[0])


def test_concurrent_runs(stub):
    sess = ort.InferenceSession(chain_model(), providers=[EP])
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(25):
                x = rng.standard_normal((int(rng.integers(1, 8)), C)).astype(np.float32)
                np.testing.assert_allclose(sess.run(None, {"x": x})[0], chain_expected(x), rtol=1e-6)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert stub.runs == 100


# --- import-time behaviour (fresh interpreters) ------------------------------------------------------
def _installed_pth() -> str | None:
    for d in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}:
        path = os.path.join(d, "migraphx_ep_autoload.pth")
        if os.path.exists(path):
            return path
    return None


def _python(code: str, **env: str) -> str:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MIGRAPHX_EP_")}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=full_env,
        check=True,
        cwd=os.path.dirname(__file__),
    ).stdout.strip()


@pytest.mark.skipif(_installed_pth() is None, reason="needs the installed wheel (its .pth file)")
def test_autoload_after_onnxruntime_import():
    probe = (
        "import sys; a = 'onnxruntime' in sys.modules; import onnxruntime as o; "
        "print(a, 'migraphx_ep' in sys.modules, 'MIGraphXExecutionProvider' in o.get_available_providers())"
    )
    assert _python(probe) == "False True True"
    assert _python(probe, MIGRAPHX_EP_NO_AUTOLOAD="1") == "False False False"


def test_disable_routing_leaves_onnxruntime_alone():
    probe = (
        "import onnxruntime as o, migraphx_ep; "
        "print(any(d.ep_name == 'MIGraphXExecutionProvider' for d in o.get_ep_devices()), "
        "'MIGraphXExecutionProvider' in o.get_available_providers())"
    )
    assert _python(probe, MIGRAPHX_EP_DISABLE_ROUTING="1", MIGRAPHX_EP_NO_AUTOLOAD="1") == "False False"
