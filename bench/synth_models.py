"""Full-size random-weight ONNX models for compile-time work on a machine without torch:

    python3 bench/synth_models.py [--out /tmp/synth_models] [--models bert_base,resnet50] [--dtypes fp32,fp16]

* ``bert_base``: ``tests/models/bert.onnx`` (``bert_fp16.onnx`` for fp16), a 2-layer HF transformers
  export, scaled to BERT-base (12 layers, hidden 768, 12 heads, intermediate 3072, vocab 30522, 512
  positions): its second layer's nodes are cloned for layers 2..11, so every layer keeps the export's
  own Shape/Gather/Unsqueeze/Concat/Reshape attention chains, Erf-GELU and LayerNormalization. The
  tiny export shares its (all-zero) biases through Identity nodes; here every weight is its own
  initializer with its own random values, as in a real checkpoint. ``batch`` and ``sequence`` stay
  symbolic.
* ``resnet50``: torchvision's ResNet-50 (v1.5) as its eval-mode export looks (batch norm folded into
  Conv biases): Conv/Relu/MaxPool, bottleneck blocks [3, 4, 6, 3] with Add, GlobalAveragePool,
  Flatten, Gemm; input ``input`` [batch, 3, 224, 224], output ``logits`` [batch, 1000].

Weights come from ``numpy.random.default_rng(seed)``. The files are large (BERT-base fp32 ~440 MB):
write them outside the repository.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MODELS_DIR = Path(__file__).resolve().parents[1] / "tests" / "models"
TINY_HIDDEN, TINY_INTERMEDIATE, TINY_HEAD = 32, 64, 16  # tests/models/bert.onnx (see its README)
LAYER1 = "/model/encoder/layer.1/"
LAYER1_OUT = "/model/encoder/layer.1/output/LayerNorm/LayerNormalization_output_0"
LAYER0_OUT = "/model/encoder/layer.0/output/LayerNorm/LayerNormalization_output_0"


@dataclass(frozen=True)
class BertConfig:
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    intermediate: int = 3072
    vocab: int = 30522
    positions: int = 512


def _split_layers(nodes: list[onnx.NodeProto]) -> tuple[list, list, list]:
    """(nodes before layer 1, layer 1's nodes, nodes after it) of the tiny export."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for i in n.input:
            readers.setdefault(i, []).append(n)

    def in_layer1(n: onnx.NodeProto) -> bool:
        if n.name.startswith(LAYER1):
            return True
        # The exporter's unnamed-scope constants (``Constant_258``) feed one layer's Unsqueeze nodes.
        users = [u for o in n.output for u in readers.get(o, [])]
        return n.op_type == "Constant" and bool(users) and all(u.name.startswith(LAYER1) for u in users)

    marks = [in_layer1(n) for n in nodes]
    first, last = marks.index(True), len(marks) - 1 - marks[::-1].index(True)
    if not all(marks[first : last + 1]):
        raise ValueError("layer 1 of the template is not one contiguous run of nodes")
    return nodes[:first], nodes[first : last + 1], nodes[last + 1 :]


def _scaled_dims(name: str, dims: list[int], c: BertConfig) -> list[int]:
    if "word_embeddings" in name:
        return [c.vocab, c.hidden]
    if "position_embeddings" in name:
        return [c.positions, c.hidden]
    if "token_type_embeddings" in name:
        return [dims[0], c.hidden]
    return [c.hidden if d == TINY_HIDDEN else c.intermediate if d == TINY_INTERMEDIATE else d for d in dims]


def _random_weight(name: str, dims: list[int], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    if "LayerNorm.weight" in name:
        v = 1.0 + 0.1 * rng.standard_normal(dims, dtype=np.float32)
    else:
        v = 0.02 * rng.standard_normal(dims, dtype=np.float32)  # BERT's initializer_range
    return v.astype(dtype)


def _rescale_constant(n: onnx.NodeProto, c: BertConfig) -> None:
    """The template's head size (16) and attention scale (1/sqrt(16)) and position ids (arange(64))."""
    t = n.attribute[0].t
    v = numpy_helper.to_array(t)
    head = c.hidden // c.heads
    if v.dtype == np.int64 and v.shape == (1,) and int(v[0]) == TINY_HEAD:
        new = np.array([head], np.int64)
    elif v.dtype.kind == "f" and v.size == 1 and float(v) == 1 / math.sqrt(TINY_HEAD):
        new = np.array(1 / math.sqrt(head), v.dtype).reshape(v.shape)
    elif v.dtype == np.int64 and v.ndim == 2 and v.shape[1] == 64 and (v.ravel() == np.arange(64)).all():
        new = np.arange(c.positions, dtype=np.int64).reshape(1, c.positions)
    else:
        return
    t.CopyFrom(numpy_helper.from_array(new, t.name))


def _clone_layer(
    nodes: list[onnx.NodeProto], layer: int, prev_out: str, origin: dict[str, str]
) -> tuple[list, str]:
    """Layer 1's nodes for ``layer``: every tensor it makes or owns renamed, its input read from
    ``prev_out``; returns the nodes and the layer's output name. ``origin`` learns new name -> old."""
    made = {o for n in nodes for o in n.output}

    def rename(name: str) -> str:
        if name == LAYER0_OUT:
            return prev_out
        if name not in made and "layer.1." not in name and not name.startswith("onnx::MatMul"):
            return name  # the model-level mask and shapes every layer reads
        new = name.replace("layer.1", f"layer.{layer}") if "layer.1" in name else f"{name}_layer{layer}"
        origin[new] = name
        return new

    out = []
    for n in nodes:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        m.name = (
            n.name.replace(LAYER1, f"/model/encoder/layer.{layer}/")
            if n.name.startswith(LAYER1)
            else f"{n.name}_layer{layer}"
        )
        m.input[:] = [rename(i) for i in n.input]
        m.output[:] = [rename(o) for o in n.output]
        out.append(m)
    return out, rename(LAYER1_OUT)


def bert(dtype: str = "fp32", config: BertConfig | None = None, seed: int = 0) -> onnx.ModelProto:
    c = config or BertConfig()
    if c.layers < 2 or c.hidden % c.heads:
        raise ValueError(f"unsupported config {c}")
    tmpl = onnx.load(str(MODELS_DIR / ("bert_fp16.onnx" if dtype == "fp16" else "bert.onnx")))
    g = tmpl.graph
    inits = {t.name: t for t in g.initializer}
    # Identity(initializer) only shares the tiny export's equal biases: read a weight of its own instead.
    aliases = {n.output[0]: n.input[0] for n in g.node if n.op_type == "Identity" and n.input[0] in inits}
    nodes = [n for n in g.node if not (n.op_type == "Identity" and n.output[0] in aliases)]
    for n in nodes:
        if n.output and n.output[0] == "last_hidden_state":
            n.output[0] = LAYER1_OUT  # the last layer (cloned below) returns it instead
    before, layer1, after = _split_layers(nodes)
    body, prev = list(layer1), LAYER1_OUT
    origin: dict[str, str] = {}  # a cloned weight's name -> its template's
    for layer in range(2, c.layers):
        clone, prev = _clone_layer(layer1, layer, prev, origin)
        body += clone
    for n in body:
        n.output[:] = ["last_hidden_state" if o == prev else o for o in n.output]
    for n in after:
        n.input[:] = ["last_hidden_state" if i == prev else i for i in n.input]
    all_nodes = before + body + after
    for n in all_nodes:
        if n.op_type == "Constant":
            _rescale_constant(n, c)

    np_type = np.float16 if dtype == "fp16" else np.float32
    rng = np.random.default_rng(seed)
    weights = []
    for name in dict.fromkeys(i for n in all_nodes for i in n.input):
        source = origin.get(name, name)
        src = inits.get(aliases.get(source, source))
        if src is None:
            continue
        dims = _scaled_dims(source, list(src.dims), c)
        weights.append(numpy_helper.from_array(_random_weight(source, dims, np_type, rng), name))

    def scaled(vi: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
        tt = vi.type.tensor_type
        dims = [
            d.dim_param or (c.hidden if d.dim_value == TINY_HIDDEN else d.dim_value) for d in tt.shape.dim
        ]
        return helper.make_tensor_value_info(vi.name, tt.elem_type, dims)

    graph = helper.make_graph(
        all_nodes,
        f"bert_base_{dtype}",
        list(g.input),
        [scaled(o) for o in g.output],
        weights,
    )
    model = helper.make_model(graph, opset_imports=list(tmpl.opset_import))
    model.ir_version = tmpl.ir_version
    return model


# -- ResNet-50 ----------------------------------------------------------------------------------------------
class _Builder:
    def __init__(self, np_type: type, rng: np.random.Generator) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.np_type, self.rng, self.n = np_type, rng, 0

    def _name(self, kind: str) -> str:
        self.n += 1
        return f"/{kind}_{self.n}"

    def weight(self, dims: list[int], fan_in: int, gain: float = 1.0) -> str:
        name = f"w{len(self.inits)}"
        v = self.rng.standard_normal(dims, dtype=np.float32) * (gain * math.sqrt(2.0 / fan_in))  # He init
        self.inits.append(numpy_helper.from_array(v.astype(self.np_type), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        name = self._name(op)
        self.nodes.append(helper.make_node(op, inputs, [f"{name}_output_0"], name=name, **attrs))
        return f"{name}_output_0"

    def conv(
        self, x: str, cin: int, cout: int, k: int, stride: int = 1, relu: bool = True, gain: float = 1.0
    ) -> str:
        w = self.weight([cout, cin, k, k], cin * k * k, gain)
        b = self.weight([cout], cout)
        p = k // 2
        y = self.node(
            "Conv", [x, w, b], kernel_shape=[k, k], strides=[stride] * 2, pads=[p] * 4, dilations=[1, 1]
        )
        return self.node("Relu", [y]) if relu else y


def resnet50(dtype: str = "fp32", seed: int = 0) -> onnx.ModelProto:
    np_type = np.float16 if dtype == "fp16" else np.float32
    b = _Builder(np_type, np.random.default_rng(seed))
    x = b.conv("input", 3, 64, 7, stride=2)
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512), strict=True)):
        for i in range(blocks):
            stride = 2 if i == 0 and stage > 0 else 1
            y = b.conv(x, cin, width, 1)
            y = b.conv(y, width, width, 3, stride=stride)  # v1.5: the stride sits on the 3x3 conv
            y = b.conv(y, width, width * 4, 1, relu=False, gain=0.2)  # a damped residual branch: fp16-safe
            skip = b.conv(x, cin, width * 4, 1, stride=stride, relu=False) if i == 0 else x
            x = b.node("Relu", [b.node("Add", [y, skip])])
            cin = width * 4
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
    w, bias = b.weight([1000, 2048], 2048), b.weight([1000], 1000)
    b.nodes.append(helper.make_node("Gemm", [x, w, bias], ["logits"], name="/fc/Gemm", transB=1))
    elem = TensorProto.FLOAT16 if dtype == "fp16" else TensorProto.FLOAT
    graph = helper.make_graph(
        b.nodes,
        f"resnet50_{dtype}",
        [helper.make_tensor_value_info("input", elem, ["batch", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", elem, ["batch", 1000])],
        b.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


BUILDERS = {"bert_base": bert, "resnet50": resnet50}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/synth_models")
    ap.add_argument("--models", default="bert_base,resnet50")
    ap.add_argument("--dtypes", default="fp32,fp16")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        for dtype in args.dtypes.split(","):
            model = BUILDERS[name](dtype, seed=args.seed)
            onnx.checker.check_model(model)
            path = out / f"{name}_{dtype}.onnx"
            onnx.save(model, str(path))
            print(f"{path}: {len(model.graph.node)} nodes, {path.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
