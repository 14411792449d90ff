"""ONNX graphs in the EP bridge's dict form, built from a ModelProto for ``parse_onnx`` and tests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..ir.dtypes import from_onnx, to_numpy

if TYPE_CHECKING:
    import onnx

# ``onnx`` is imported where it is used: the EP's graphs come from ORT as dicts, and importing onnx
# (0.06-0.14 s) on every session's path only delayed the first compile.

GraphDict = dict[str, Any]


class UnsupportedAttr:
    """Marks an attribute the compiler cannot read (sparse tensors, type protos...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __repr__(self) -> str:
        return f"Unsupported({self.kind})"


UnsupportedAttr.__name__ = "Unsupported"  # NodeDesc.attr recognises either marker by this name


def tensor_to_array(t: onnx.TensorProto, base_dir: str | None = None) -> np.ndarray:
    if t.data_type in (16, 17, 18, 19, 20):  # bf16 and fp8: stored as raw bits
        dt = to_numpy(from_onnx(t.data_type))
        if t.raw_data:
            arr = np.frombuffer(t.raw_data, dtype=dt)
        else:
            bits = np.asarray(t.int32_data, dtype=np.uint32)
            arr = (bits.astype(np.uint16) if dt.itemsize == 2 else bits.astype(np.uint8)).view(dt)
        return arr.reshape(tuple(t.dims))
    from onnx import numpy_helper

    return numpy_helper.to_array(t, base_dir or "")


def _attr_value(a: onnx.AttributeProto, base_dir: str | None) -> Any:
    import onnx

    A = onnx.AttributeProto
    if a.type == A.TENSOR:
        try:
            return tensor_to_array(a.t, base_dir)
        except Exception as e:  # noqa: BLE001 - any unreadable tensor is just "unsupported"
            return UnsupportedAttr(f"tensor ({e})")
    if a.type == A.GRAPH:
        return "<graph>"
    if a.type in (A.FLOAT, A.INT, A.STRING, A.FLOATS, A.INTS, A.STRINGS):
        v = onnx.helper.get_attribute_value(a)
        if a.type == A.STRING:
            return v.decode("utf-8", "replace")
        if a.type == A.STRINGS:
            return [s.decode("utf-8", "replace") for s in v]
        if a.type in (A.FLOATS, A.INTS):
            return list(v)
        return v
    return UnsupportedAttr(A.AttributeType.Name(a.type).lower())


def _value_info(vi: onnx.ValueInfoProto) -> dict[str, Any]:
    tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    if tt is None:
        return {"dtype": 0, "shape": None}
    shape = None
    if tt.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
    return {"dtype": int(tt.elem_type), "shape": shape}


def graph_to_dict(
    g: onnx.GraphProto,
    opsets: dict[str, int],
    base_dir: str | None = None,
    schemas_version: int | None = None,
) -> GraphDict:
    import onnx

    inits = {t.name: tensor_to_array(t, base_dir) for t in g.initializer}
    values: dict[str, dict] = {}
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        values[vi.name] = _value_info(vi)
    for name, arr in inits.items():
        try:
            values[name] = {
                "dtype": onnx.helper.np_dtype_to_tensor_dtype(arr.dtype),
                "shape": list(arr.shape),
            }
        except (KeyError, ValueError):
            values[name] = {"dtype": 0, "shape": list(arr.shape)}
    nodes = []
    for i, n in enumerate(g.node):
        domain = n.domain if n.domain != "ai.onnx" else ""
        version = opsets.get(domain, opsets.get("", 1))
        try:
            since = onnx.defs.get_schema(n.op_type, version, domain).since_version
        except Exception:  # noqa: BLE001 - unknown/custom ops keep the model's opset
            since = version
        nodes.append(
            {
                "index": i,
                "name": n.name,
                "op_type": n.op_type,
                "domain": domain,
                "since_version": since,
                "inputs": list(n.input),
                "outputs": list(n.output),
                "implicit_inputs": [],
                "attributes": {a.name: _attr_value(a, base_dir) for a in n.attribute},
                "subgraphs": {
                    a.name: graph_to_dict(a.g, opsets, base_dir)
                    for a in n.attribute
                    if a.type == onnx.AttributeProto.GRAPH
                },
            }
        )
        for o in n.output:
            values.setdefault(o, {"dtype": 0, "shape": None})
    return {
        "name": g.name,
        "nodes": nodes,
        "inputs": [vi.name for vi in g.input if vi.name not in inits],
        "outputs": [vi.name for vi in g.output],
        "values": values,
        "initializers": inits,
        "opsets": dict(opsets),
    }


def model_to_dict(
    model: onnx.ModelProto, base_dir: str | None = None, infer_shapes: bool = True
) -> GraphDict:
    import onnx

    if infer_shapes:
        try:
            model = onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001 - inference is a convenience; parsing computes shapes itself
            pass
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    return graph_to_dict(model.graph, opsets, base_dir)
