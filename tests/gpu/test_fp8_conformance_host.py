"""ONNX's float8 Cast, CastLike, QuantizeLinear and DequantizeLinear node tests that the ref claims, run
without a GPU: claimed whole by the gpu partitioner, lowered, their generated kernels compiled for the
host (``test_lowering_host.host_kernels``) and the simulator, byte for byte against the ref."""

from __future__ import annotations

import functools
import warnings

import onnx
import pytest
from onnx.backend.test.loader import load_model_tests

from migraphx_ep.conformance import _array
from migraphx_ep.ep.partition import partition
from migraphx_ep.frontend import model_to_dict

from .decomposecheck import check_decomposed
from .test_lowering_host import host_kernels, kdir  # noqa: F401 - fixtures

OPS = ("test_cast", "test_dequantizelinear", "test_quantizelinear")


@functools.cache
def cases() -> dict[str, object]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cases' own generators warn about overflowing casts
        found = load_model_tests(kind="node")
    fp8 = ("FLOAT8", "e4m3", "e5m2")
    return {c.name: c for c in found if c.name.startswith(OPS) and any(k in c.name for k in fp8)}


def feeds(model: onnx.ModelProto, data) -> dict:  # noqa: ANN001
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    return dict(zip(names, (_array(x) for x in data[0][0]), strict=True))


def test_there_are_float8_cases() -> None:
    assert len(cases()) >= 75


@pytest.mark.parametrize("name", sorted(cases()))
def test_float8_node_case(host_kernels, name: str) -> None:  # noqa: ANN001, F811
    case = cases()[name]
    if partition(model_to_dict(case.model)).refused:
        pytest.skip("the ref refuses it too")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_decomposed(case.model, feeds(case.model, case.data_sets), [])
