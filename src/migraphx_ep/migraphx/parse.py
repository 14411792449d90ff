"""``parse_onnx`` of the MIGraphX Python API, over the frontend's ``model_to_dict`` + ``parse_graph``."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping, Sequence

import onnx

from ..frontend import ParseError, Unsupported, fixed_dims, model_to_dict, parse_graph
from ..ir.dtypes import UnsupportedTypeError, from_onnx
from ..ir.shape import DynamicDimension, Shape, ShapeError
from .program import program


# -- parsing, loading, saving ----------------------------------------------------------------------------
def _input_shapes(
    graph: dict,
    map_input_dims: Mapping[str, Sequence[int]],
    map_dyn: Mapping[str, Sequence[DynamicDimension]],
    default_dyn: DynamicDimension | None,
) -> dict[str, Shape]:
    inputs, infos = list(graph["inputs"]), graph["values"]
    unknown = sorted((set(map_input_dims) | set(map_dyn)) - set(inputs))
    if unknown:
        raise ValueError(f"parse_onnx: no model input named {unknown}; inputs are {inputs}")
    shapes: dict[str, Shape] = {}
    for name in inputs:
        info = infos.get(name) or {}
        declared = info.get("shape")
        symbolic = declared is not None and any(not isinstance(d, int) or d < 0 for d in declared)
        if name not in map_input_dims and name not in map_dyn and not (default_dyn is not None and symbolic):
            continue
        if not info.get("dtype"):
            raise ValueError(f"parse_onnx: input {name!r} has no tensor element type")
        t = from_onnx(info["dtype"])
        given = map_input_dims.get(name) if name in map_input_dims else map_dyn.get(name)
        if given is not None and declared is not None and len(list(given)) != len(declared):
            raise ValueError(
                f"parse_onnx: input {name!r} has rank {len(declared)}, given {len(list(given))} dims"
            )
        if name in map_input_dims:
            shapes[name] = Shape(t, [int(d) for d in map_input_dims[name]])
        elif name in map_dyn:
            shapes[name] = Shape(t, dyn_dims=list(map_dyn[name]))
        else:
            dims = [
                DynamicDimension(d, d) if isinstance(d, int) and d >= 0 else default_dyn for d in declared
            ]
            shapes[name] = Shape(t, dyn_dims=dims)  # type: ignore[arg-type]
    return shapes


def parse_onnx_buffer(
    buffer: bytes,
    default_dim_value: int = 1,
    map_input_dims: Mapping | None = None,
    skip_unknown_operators: bool = False,
    print_program_on_error: bool = False,
    max_loop_iterations: int = 10,
    limit_max_iterations: int = 65535,
    default_dyn_dim_value: DynamicDimension | None = None,
    map_dyn_input_dims: Mapping | None = None,
    base_dir: str | None = None,
) -> program:
    return _parse_model(
        onnx.load_model_from_string(buffer),
        base_dir,
        "<buffer>",
        default_dim_value,
        map_input_dims or {},
        skip_unknown_operators,
        print_program_on_error,
        max_loop_iterations,
        limit_max_iterations,
        default_dyn_dim_value,
        map_dyn_input_dims or {},
    )


def parse_onnx(
    filename: str | os.PathLike,
    default_dim_value: int = 1,
    map_input_dims: Mapping | None = None,
    skip_unknown_operators: bool = False,
    print_program_on_error: bool = False,
    max_loop_iterations: int = 10,
    limit_max_iterations: int = 65535,
    default_dyn_dim_value: DynamicDimension | None = None,
    map_dyn_input_dims: Mapping | None = None,
) -> program:
    """Parse an ONNX file. ``skip_unknown_operators``: nodes that cannot be compiled leave their outputs
    as extra parameters instead of failing. The loop limits are accepted for API compatibility."""
    path = os.fspath(filename)
    try:
        model = onnx.load(path)
    except Exception as e:  # noqa: BLE001 - protobuf and IO errors alike
        raise ParseError(f"parse_onnx({path}): cannot read the model: {e}") from e
    return _parse_model(
        model,
        os.path.dirname(os.path.abspath(path)),
        path,
        default_dim_value,
        map_input_dims or {},
        skip_unknown_operators,
        print_program_on_error,
        max_loop_iterations,
        limit_max_iterations,
        default_dyn_dim_value,
        map_dyn_input_dims or {},
    )


def _parse_model(
    model: onnx.ModelProto,
    base_dir: str | None,
    label: str,
    default_dim_value: int,
    map_input_dims: Mapping,
    skip_unknown: bool,
    print_on_error: bool,
    max_loop_iterations: int,
    limit_max_iterations: int,
    default_dyn: DynamicDimension | None,
    map_dyn: Mapping,
) -> program:
    if int(default_dim_value) < 0 or not 0 < int(max_loop_iterations) <= int(limit_max_iterations):
        raise ValueError(
            "parse_onnx: need default_dim_value >= 0 and 0 < max_loop_iterations <= limit_max_iterations"
        )
    if default_dyn is not None and default_dyn.is_fixed():
        default_dim_value, default_dyn = default_dyn.min, None
    graph = model_to_dict(model, base_dir)
    shapes = _input_shapes(graph, map_input_dims, map_dyn, default_dyn)
    resolve = fixed_dims(int(default_dim_value))
    try:
        res = parse_graph(graph, shapes, resolve, tolerant=skip_unknown)
    except (ParseError, Unsupported, ShapeError, UnsupportedTypeError) as e:
        if print_on_error:
            try:
                partial = str(parse_graph(graph, shapes, resolve, tolerant=True).program)
            except (ParseError, Unsupported, ShapeError, UnsupportedTypeError) as e2:
                partial = f"(nothing: {e2})"
            print(f"parse_onnx({label}): program parsed before the error:\n{partial}", file=sys.stderr)
        raise ParseError(f"parse_onnx({label}): {e}") from e
    if res.refused:
        nodes = graph["nodes"]
        detail = "; ".join(
            f"{nodes[i]['op_type']}{'(' + nodes[i]['name'] + ')' if nodes[i]['name'] else ''}: {why}"
            for i, why in list(res.refused.items())[:5]
        )
        warnings.warn(
            f"parse_onnx({label}): {len(res.refused)} node(s) skipped, their outputs are parameters: "
            f"{detail}",
            RuntimeWarning,
            stacklevel=3,
        )
    return program(res.program)


def parse_tf(
    filename: str,
    is_nhwc: bool = True,
    batch_size: int = 1,
    map_input_dims: Mapping | None = None,
    output_names: Sequence[str] = (),
) -> program:
    raise NotImplementedError(
        "parse_tf: TensorFlow models are not supported by migraphx_ep; "
        "convert the model to ONNX (e.g. with tf2onnx) and use parse_onnx"
    )
