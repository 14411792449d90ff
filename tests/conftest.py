"""Fixtures for the C++ shell tests: a tiny numpy stub backend injected through bridge.set_backend, and
helpers to build models in memory and to read ORT profiles."""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import threading

import ml_dtypes
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import pytest

import migraphx_ep
from migraphx_ep.ep import bridge

EP = migraphx_ep.EP_NAME


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, np.zeros((), x.dtype))


# op_type -> numpy implementation; the stub claims exactly these (ai.onnx domain).
STUB_OPS = {
    "Add": lambda a, b: np.add(a, b),
    "Mul": lambda a, b: np.multiply(a, b),
    "Relu": _relu,
    "Not": np.logical_not,
    "And": np.logical_and,
}


def convex_groups(graph: dict, claimed: set[int]) -> list[list[int]]:
    """Weakly connected components of the claimed nodes; a component that is not convex (an unclaimed
    node on a path between two of its nodes) is split into single nodes, which always are."""
    nodes = graph["nodes"]
    producer = {o: n["index"] for n in nodes for o in n["outputs"] if o}
    consumers: dict[int, set[int]] = {n["index"]: set() for n in nodes}
    for n in nodes:
        for i in n["inputs"] + n["implicit_inputs"]:
            if i in producer:
                consumers[producer[i]].add(n["index"])
    parent = {i: i for i in claimed}

    def find(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i in claimed:
        for c in consumers[i] & claimed:
            parent[find(c)] = find(i)
    comps: dict[int, list[int]] = {}
    for i in sorted(claimed):
        comps.setdefault(find(i), []).append(i)
    groups = []
    for comp in comps.values():
        members = set(comp)
        outside = {c for i in comp for c in consumers[i] if c not in members}
        stack, seen, convex = list(outside), set(outside), True
        while stack and convex:
            for c in consumers[stack.pop()]:
                convex = convex and c not in members
                if c not in seen:
                    seen.add(c)
                    stack.append(c)
        groups.extend([comp] if convex else [[i] for i in comp])
    return groups


class StubCompiled:
    def __init__(self, backend: StubBackend, graph: dict, name: str) -> None:
        self.backend, self.graph, self.name = backend, graph, name
        self.released = False

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if self.backend.fail_run:
            raise RuntimeError("stub run exploded: kaboom")
        self.backend.runs += 1
        env = dict(self.graph["initializers"])
        env.update(zip(self.graph["inputs"], inputs, strict=True))
        for n in self.graph["nodes"]:
            out = STUB_OPS[n["op_type"]](*(env[i] for i in n["inputs"]))
            env[n["outputs"][0]] = out
        return [env[o] for o in self.graph["outputs"]]

    def release(self) -> None:
        self.released = True


class StubEp:
    def __init__(self, backend: StubBackend, options: dict[str, str]) -> None:
        self.backend, self.options = backend, options

    def get_capability(self, graph: dict) -> list[list[int]]:
        self.backend.graphs.append(graph)
        claimed = {n["index"] for n in graph["nodes"] if n["domain"] == "" and n["op_type"] in STUB_OPS}
        return convex_groups(graph, claimed)

    def compile(self, graph: dict, fused_node_name: str) -> StubCompiled:
        if self.backend.fail_compile:
            raise ValueError("stub compile refused: boom")
        c = StubCompiled(self.backend, graph, fused_node_name)
        self.backend.compiled.append(c)
        return c

    def release(self) -> None:
        self.backend.released_eps += 1


class StubBackend:
    def __init__(self) -> None:
        self.options: list[dict[str, str]] = []
        self.graphs: list[dict] = []
        self.compiled: list[StubCompiled] = []
        self.fail_compile = False
        self.fail_run = False
        self.runs = 0
        self.released_eps = 0
        self.lock = threading.Lock()

    def create_ep(self, options: dict[str, str]) -> StubEp:
        self.options.append(options)
        return StubEp(self, options)


@pytest.fixture
def stub():
    backend = StubBackend()
    bridge.set_backend(backend)
    yield backend
    bridge.set_backend(None)


def load_script(path: str, name: str):
    """The module in file ``path`` (a tool or example script outside the package), imported as ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def make_model(nodes, inputs, outputs, initializers=(), opset=17, check=True) -> bytes:
    graph = oh.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    model.ir_version = 9  # the stock onnxruntime wheel may lag behind onnx's newest IR version
    if check:  # the checker insists on shapes for graph inputs; some tests want them unknown
        onnx.checker.check_model(model)
    return model.SerializeToString()


def tensor(name: str, elem_type: int, shape) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, elem_type, shape)


def profiled_options():
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.enable_profiling = True
    # A fresh directory per session: ORT names profiles by timestamp, which parallel workers can share.
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="migraphx_ep_profile_"), "profile")
    return so


def node_providers(sess) -> dict[str, str]:
    """Profile of a finished session: kernel event name -> provider that ran it."""
    path = sess.end_profiling()
    try:
        with open(path) as f:
            events = json.load(f)
    finally:
        os.remove(path)
    nodes = [e for e in events if e.get("cat") == "Node" and "provider" in e.get("args", {})]
    return {e["name"]: e["args"]["provider"] for e in nodes}


BF16 = np.dtype(ml_dtypes.bfloat16)


C = 1200  # channels: b is > 4 KiB, so it reaches the backend as a zero-copy view of ORT's memory
W = np.linspace(-1, 1, C, dtype=np.float32)
B = np.arange(C, dtype=np.float32) / C


def chain_model() -> bytes:
    """y = relu(x + w) * b: Add -> Relu -> Mul, all claimed by the stub."""
    nodes = [
        oh.make_node("Add", ["x", "w"], ["t"], name="add"),
        oh.make_node("Relu", ["t"], ["r"], name="relu"),
        oh.make_node("Mul", ["r", "b"], ["y"], name="mul"),
    ]
    inits = [nh.from_array(W, "w"), nh.from_array(B, "b")]
    return make_model(
        nodes,
        [tensor("x", onnx.TensorProto.FLOAT, ["N", C])],
        [tensor("y", onnx.TensorProto.FLOAT, ["N", C])],
        inits,
    )


def chain_expected(x: np.ndarray) -> np.ndarray:
    return np.maximum(x + W, 0) * B


def ones(n: int = 1) -> np.ndarray:
    return np.ones((n, C), np.float32)


def ran_on(sess) -> set[str]:
    return set(node_providers(sess).values())


class RecordingBackend:
    """The EP's own backend, keeping every EP it creates so a test can read what they compiled."""

    def __init__(self) -> None:
        self.eps: list = []

    def create_ep(self, options: dict[str, str]):
        from migraphx_ep.ep import provider

        ep = provider.create_ep(options)
        self.eps.append(ep)
        return ep

    def counts(self) -> tuple[int, int]:
        """(programs compiled, programs loaded) by the newest EP."""
        compiled = self.eps[-1].compiled
        return sum(c.compiles for c in compiled), sum(c.loads for c in compiled)


@pytest.fixture
def recording():
    backend = RecordingBackend()
    bridge.set_backend(backend)
    yield backend
    bridge.set_backend(None)
