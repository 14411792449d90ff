"""ONNX frontend: one parser table serving both ``parse_onnx`` and the EP's Compile."""

from . import parsers  # noqa: F401 - registers every parser in the table
from .context import NodeDesc, ParseContext, normalize_axis
from .graph import graph_to_dict, model_to_dict
from .parser import ParseError, ParseResult, parse_graph
from .probe import fixed_dims, probe_dims
from .table import PARSERS, Unsupported, onnx_op

__all__ = [
    "PARSERS",
    "NodeDesc",
    "ParseContext",
    "ParseError",
    "ParseResult",
    "Unsupported",
    "fixed_dims",
    "graph_to_dict",
    "model_to_dict",
    "normalize_axis",
    "onnx_op",
    "parse_graph",
    "probe_dims",
]
