"""Whole PyTorch-exported models (tiny, random weights; see tests/models/README.md) through the frontend.

Each model is parsed for concrete input shapes, compiled for the ref target and compared with ORT's CPU
provider, in float32 and float16, at two batch/sequence sizes (the files have symbolic batch/sequence
dims). A second test asks the partitioner to claim every node and prints the refusal reasons otherwise.
"""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import migraphx_ep.targets
from migraphx_ep.ep.partition import partition
from migraphx_ep.frontend import model_to_dict, parse_graph
from migraphx_ep.ir.dtypes import from_numpy
from migraphx_ep.ir.shape import Shape

MODELS_DIR = Path(__file__).parent / "models"
TEXT = {"bert", "bert_opset14", "gpt2"}
NAMES = ["resnet", "resnet_bn", "mobilenet_v2", "bert", "bert_opset14", "gpt2", "vit"]
FILES = [n + suffix for n in NAMES for suffix in ("", "_fp16")]
# (batch, sequence): sequence only matters for the text models; GPT-2 has 32 positions, BERT 64.
SIZES = [(2, 16), (1, 7)]

# float32: ORT and numpy differ only in summation order (GEMM blocking, reductions), a few ulp on
# O(1..10) outputs; ORT vs PyTorch on these files is <= 4e-6 absolute.
FP32_TOL = {"rtol": 1e-4, "atol": 1e-5}
# float16: one ulp is ~1e-3 relative. ORT's CPU kernels often compute in fp32 and round once (Conv with
# its bias, LayerNormalization), while the ref target rounds after every instruction (conv, then the bias
# add). Measured against the fp16 files evaluated in fp32: ORT is off by <= 4e-3, ref by <= 8e-3 on O(1)
# outputs (worst: mobilenet_v2's 52 convs). 1e-2 + 1e-2*|x| still catches a wrong op by far.
FP16_TOL = {"rtol": 1e-2, "atol": 1e-2}


def model_path(name: str) -> Path:
    return MODELS_DIR / f"{name}.onnx"


@functools.cache
def load(name: str) -> onnx.ModelProto:
    return onnx.load(str(model_path(name)))


@functools.cache
def graph_dict(name: str) -> dict:
    return model_to_dict(load(name))


@functools.cache
def ort_session(name: str) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1  # the CI machine has 2 cores; pytest may run in parallel
    return ort.InferenceSession(str(model_path(name)), so, providers=["CPUExecutionProvider"])


def make_feeds(name: str, batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1234 + 31 * batch + seq)
    base = name.removesuffix("_fp16")
    if base in TEXT:
        mask = np.ones((batch, seq), np.int64)
        mask[-1, -2:] = 0  # a padded tail on the last row keeps the masking path honest
        feeds = {"input_ids": rng.integers(0, 100, (batch, seq), dtype=np.int64), "attention_mask": mask}
        if base.startswith("bert"):
            feeds["token_type_ids"] = (np.arange(seq) >= seq // 2).astype(np.int64)[None].repeat(batch, 0)
        return feeds
    dtype = np.float16 if name.endswith("_fp16") else np.float32
    return {"pixel_values": rng.standard_normal((batch, 3, 32, 32)).astype(dtype)}


def refusal_report(name: str, refused: dict[int, str]) -> str:
    nodes = {n["index"]: n for n in graph_dict(name)["nodes"]}
    by_op = Counter(nodes[i]["op_type"] for i in refused)
    lines = [f"{name}: {len(refused)} of {len(nodes)} nodes refused; by op: {dict(by_op.most_common())}"]
    seen: set[tuple[str, str]] = set()
    for i, why in sorted(refused.items()):
        key = (nodes[i]["op_type"], why.split("'")[0])  # one line per op and kind of reason
        if key not in seen:
            seen.add(key)
            lines.append(f"  [{i}] {nodes[i]['op_type']} {nodes[i]['name']}: {why}")
    return "\n".join(lines)


@pytest.mark.parametrize("batch,seq", SIZES)
@pytest.mark.parametrize("name", FILES)
def test_model_matches_onnxruntime(name: str, batch: int, seq: int) -> None:
    feeds = make_feeds(name, batch, seq)
    sess = ort_session(name)
    assert [i.name for i in sess.get_inputs()] == list(feeds)
    expected = sess.run(None, feeds)

    shapes = {k: Shape(from_numpy(a.dtype), list(a.shape)) for k, a in feeds.items()}
    prog = parse_graph(graph_dict(name), shapes).program
    prog.compile(migraphx_ep.targets.get_target("ref"))
    results = prog.run_numpy(feeds)

    assert len(results) == len(expected)
    tol = FP16_TOL if name.endswith("_fp16") else FP32_TOL
    for out, got, want in zip(sess.get_outputs(), results, expected, strict=True):
        assert got.dtype == want.dtype, f"{out.name}: {got.dtype} vs {want.dtype}"
        assert got.shape == want.shape, f"{out.name}: {got.shape} vs {want.shape}"
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), err_msg=out.name, **tol)


@pytest.mark.parametrize("name", FILES)
def test_partition_claims_every_node(name: str) -> None:
    result = partition(graph_dict(name))
    assert result.refused == {}, refusal_report(name, result.refused)
    assert len(result.groups) == 1, f"{name}: {len(result.groups)} groups, expected one"


def test_fixtures_are_small_and_dynamic() -> None:
    total = 0
    for name in FILES:
        size = model_path(name).stat().st_size
        assert size < 1 << 20, f"{name}: {size} bytes"
        total += size
        for vi in load(name).graph.input:
            batch = vi.type.tensor_type.shape.dim[0].dim_param
            assert batch == "batch", f"{name}:{vi.name} batch dim is not symbolic"
    assert total < 6 << 20
