"""The benchmark's models as plain data: names, inputs, outputs, default batches, file names.

Shared by ``export_models.py`` (which writes the files) and ``run.py`` (which feeds them), so both agree
on input names and value ranges. Nothing here imports torch: ``run.py`` must work without it (ORT-only
systems, or ONNX files given by path).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

SEQ = 128  # BERT/GPT-2 sequence length; static in the exported graphs (only batch is dynamic)
IMAGE = 224
DTYPES = ("fp32", "fp16")  # the exported files' types (export_models.py writes one file per dtype)
# Rows on the fp32 file with our EP's migraphx_int8_enable / migraphx_fp8_enable and ORT's QDQ model
# (bench/quant_rows.py); they take fp32 inputs.
QUANT_DTYPES = ("int8", "fp8")
ALL_DTYPES = DTYPES + QUANT_DTYPES
# Largest max|ours - ref| / max|ref| before a comparison is flagged (``ok: false``), per row dtype.
# int8/fp8 rows compare with the fp32 model's output (on ORT's CPU EP), so the quantisation error
# itself counts: measured 3-4% for int8 and 8-9% for fp8 on ResNet-50 and BERT-base (README).
MAX_REL = {"fp32": 1e-2, "fp16": 2e-2, "int8": 0.1, "fp8": 0.2}
DEFAULT_MODEL_DIR = "/tmp/bench_models"
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Input:
    name: str
    kind: str  # "image" (float, normal), "ids" (int64 in [0, high)), "ones", "segments" (0s then 1s)
    shape: tuple[int | str, ...]  # "batch" marks the dynamic axis
    high: int = 0


@dataclass(frozen=True)
class Model:
    name: str
    inputs: tuple[Input, ...]
    outputs: tuple[str, ...]
    batches: tuple[int, ...]

    def file(self, model_dir: str | Path, dtype: str) -> Path:
        """The exported file a row of ``dtype`` runs: int8/fp8 rows start from the fp32 file."""
        return Path(model_dir) / f"{self.name}_{'fp32' if dtype in QUANT_DTYPES else dtype}.onnx"


def _text(vocab: int, segments: bool) -> tuple[Input, ...]:
    ids = (Input("input_ids", "ids", ("batch", SEQ), vocab), Input("attention_mask", "ones", ("batch", SEQ)))
    return ids + ((Input("token_type_ids", "segments", ("batch", SEQ)),) if segments else ())


# Vocabulary sizes are those of the default BertConfig / GPT2Config (base models).
MODELS: dict[str, Model] = {
    m.name: m
    for m in (
        Model("resnet50", (Input("input", "image", ("batch", 3, IMAGE, IMAGE)),), ("logits",), (1, 32)),
        Model("bert_base", _text(30522, True), ("last_hidden_state", "pooler_output"), (1, 8)),
        Model("gpt2", _text(50257, False), ("last_hidden_state",), (1,)),
    )
}


def parse_dtypes(text: str) -> list[str]:
    """``--dtypes``: a comma list of :data:`ALL_DTYPES`, in the given order, without repeats."""
    dtypes = list(dict.fromkeys(d.strip() for d in text.split(",") if d.strip()))
    unknown = [d for d in dtypes if d not in ALL_DTYPES]
    if unknown or not dtypes:
        raise ValueError(f"unknown dtypes {unknown or [text]}; choose from {list(ALL_DTYPES)}")
    return dtypes


def make_feeds(model: Model, batch: int, dtype: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs; float inputs take the model's dtype, token inputs stay int64."""
    rng = np.random.default_rng(seed)
    fdt = np.float16 if dtype == "fp16" else np.float32
    feeds = {}
    for i in model.inputs:
        shape = tuple(batch if d == "batch" else int(d) for d in i.shape)
        if i.kind == "image":
            feeds[i.name] = rng.standard_normal(shape, dtype=np.float32).astype(fdt)
        elif i.kind == "ids":
            feeds[i.name] = rng.integers(0, i.high, size=shape, dtype=np.int64)
        elif i.kind == "ones":
            feeds[i.name] = np.ones(shape, np.int64)
        elif i.kind == "segments":
            second_half = np.arange(shape[-1]) >= shape[-1] // 2
            feeds[i.name] = np.ascontiguousarray(np.broadcast_to(second_half, shape), dtype=np.int64)
        else:
            raise ValueError(f"unknown input kind {i.kind!r}")
    return feeds


def feeds_for_file(path: str | Path, batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for an arbitrary ONNX file: dim 0 symbolic -> batch, other symbolic dims -> ``seq``.

    Integer inputs named like masks are all ones; other integer inputs are drawn from {0, 1} (valid
    token ids for any vocabulary); float inputs are standard normal.
    """
    rng = np.random.default_rng(seed)
    m = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    feeds = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = [
            d.dim_value if d.HasField("dim_value") else (batch if k == 0 else seq)
            for k, d in enumerate(tt.shape.dim)
        ]
        dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if dt.kind in "iu":
            feeds[vi.name] = np.ones(dims, dt) if "mask" in vi.name else rng.integers(0, 2, dims).astype(dt)
        elif dt.kind == "b":
            feeds[vi.name] = np.ones(dims, bool)
        else:
            feeds[vi.name] = rng.standard_normal(dims, dtype=np.float32).astype(dt)
    return feeds


def file_dtype(path: str | Path) -> str:
    """'fp16' if any graph input or output is float16, else 'fp32' (a label for report tables)."""
    m = onnx.load(str(path), load_external_data=False)
    values = list(m.graph.input) + list(m.graph.output)
    return "fp16" if any(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 for v in values) else "fp32"
