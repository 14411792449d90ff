"""int8 and fp8 rows of the benchmark: what each system runs there, the calibration table, the QDQ model
and the fp32 reference.

An int8 or fp8 row starts from the model's **fp32** file (as ``int8_accuracy.py`` does) and fp32 inputs:

- ``migraphx_ep`` / ``migraphx_ep_iobinding``: that file with ``migraphx_{int8,fp8}_enable=1`` and
  ``migraphx_int8_calibration_table_name`` = a ``calibration.json`` made by ORT's own calibrator
  (:func:`calibrate`: MinMax over a fixed seeded calibration set), plus ``--quant-ep-option`` extras
  (e.g. ``migraphx_fp16_enable=1`` for the ops that are not quantised);
- ``ort_cuda_numpy`` / ``ort_cuda_iobinding`` / ``ort_cpu`` and ``migraphx_ep_qdq`` /
  ``migraphx_ep_qdq_iobinding``: the QDQ model ``onnxruntime.quantization.quantize_static`` makes from
  the same file and calibration set (QDQ format, Conv/MatMul/Gemm, ORT's default types: uint8
  activations with zero points, symmetric int8 weights, per tensor), on int8 rows only: there is no fp8
  QDQ peer;
- torch: not run (a ``skipped`` line with the reason).

The table and the QDQ model are files in ``--model-dir`` next to the models, named after the fp32 file
and the calibration set, so a second run reuses them (remade when older than the fp32 file). Every
output of an int8/fp8 row is compared with the fp32 file's output on ORT's CPU EP (``vs_fp32``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import specs
import systems

CALIB_SEED = 1000  # calibration inputs use seeds 1000, 1001, ... (the rows' inputs use --seed, 0)
QDQ_OPS = ("Conv", "MatMul", "Gemm")  # what our EP quantises (dot and convolution inputs)
QDQ_SUFFIX = "u8.qdq.onnx"  # ORT's default types; the name keeps an older symmetric model from being reused
TORCH = ("torch_eager", "torch_compile_default", "torch_compile_reduce-overhead")
OURS_QDQ = ("migraphx_ep_qdq", "migraphx_ep_qdq_iobinding")
QDQ_SYSTEMS = ("ort_cuda_numpy", "ort_cuda_iobinding", "ort_cpu", *OURS_QDQ)  # they run the QDQ model


class QuantError(RuntimeError):
    """The calibration table or the QDQ model could not be made (the message says which and why)."""


def skip_reason(system: str, dtype: str) -> str | None:
    """Why ``system`` does not run a ``dtype`` row: None (it runs), "" (silently: not applicable) or a
    reason for a ``skipped`` line."""
    if dtype not in specs.QUANT_DTYPES:
        return "" if system in OURS_QDQ else None  # a QDQ model exists for int8 rows only
    if system in TORCH:
        return (
            f"torch runs no {dtype} rows (no quantised torch module; the int8 peer is ORT on the QDQ model)"
        )
    if dtype == "fp8" and system in QDQ_SYSTEMS:
        return "no fp8 QDQ model: ORT and our EP run the int8 QDQ model on int8 rows only"
    return None


def unavailable(error: BaseException) -> bool:
    """A missing package, provider or GPU feature, not a wrong answer (fp8 needs compute capability 8.9+)."""
    return isinstance(error, systems.Unavailable) or "fp8 support" in str(error)


class _Reader:
    """ORT's CalibrationDataReader protocol over a fixed list of feeds (only the graph's inputs)."""

    def __init__(self, samples: list[dict[str, np.ndarray]], names: set[str]) -> None:
        self.left = [{k: v for k, v in s.items() if k in names} for s in reversed(samples)]

    def get_next(self) -> dict[str, np.ndarray] | None:
        return self.left.pop() if self.left else None


def _input_names(path: str | Path) -> set[str]:
    m = onnx.load(str(path), load_external_data=False)
    return {i.name for i in m.graph.input} - {t.name for t in m.graph.initializer}


def calibrate(path: str | Path, samples: list[dict[str, np.ndarray]], out: Path) -> Path:
    """ORT's MinMax calibrator over ``samples`` (one run each, on ORT's CPU EP); writes its
    ``calibration.json`` (and ``.flatbuffers``, ``.cache``) into the folder ``out``; returns the json."""
    from onnxruntime.quantization import create_calibrator, write_calibration_table

    cal = create_calibrator(str(path), augmented_model_path=str(out / "augmented.onnx"))
    cal.collect_data(_Reader(samples, _input_names(path)))
    write_calibration_table(cal.compute_data(), dir=str(out))
    return out / "calibration.json"


def quantize_qdq(path: str | Path, samples: list[dict[str, np.ndarray]], out: Path) -> Path:
    """``quantize_static`` with its defaults (what a user gets): QDQ format, uint8 activations with zero
    points, symmetric int8 weights, per tensor, MinMax over ``samples``; Conv/MatMul/Gemm only, so the
    rows compare the quantised GEMMs. Writes the model to ``out``."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    quantize_static(
        str(path),
        str(out),
        _Reader(samples, _input_names(path)),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=list(QDQ_OPS),
        per_channel=False,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
    )
    return out


def _fresh(path: Path, source: Path) -> bool:
    return path.is_file() and path.stat().st_mtime >= source.stat().st_mtime


def _cached(path: Path, source: Path, make: Callable[[Path], Path]) -> float | None:
    """Make ``path`` (``make`` gets a scratch folder on the same file system and returns the file to
    move there) unless a copy newer than ``source`` exists; seconds spent, None when cached."""
    if _fresh(path, source):
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".quant_") as tmp:
        os.replace(make(Path(tmp)), path)  # a killed run leaves no half-written file under the name
    return time.perf_counter() - t0


@dataclasses.dataclass
class Prepared:
    """A file made once per fp32 model (or the error that stopped it) and how long it took."""

    path: Path | None = None
    seconds: float | None = None  # None: taken from the cache
    error: str = ""
    missing: bool = False  # the error is a missing package (onnxruntime.quantization, flatbuffers...)


class Quant:
    """Makes (once per run, and once per model dir thanks to the files) what int8/fp8 rows need."""

    def __init__(
        self, model_dir: str | Path, samples: int, seq: int, extra_options: dict[str, str] | None = None
    ) -> None:
        self.model_dir = Path(model_dir)
        self.samples = max(1, samples)
        self.seq = seq
        self.extra_options = dict(extra_options or {})
        self.made: dict[tuple[Path, str], Prepared] = {}
        self.refs: dict[tuple[Path, int], tuple[list[np.ndarray] | None, str]] = {}

    # -- files ----------------------------------------------------------------------------------------
    def prefix(self, row: systems.Row) -> Path:
        """``--model-dir``/<fp32 file's stem>.calib-n<N>[...]: the calibration set is in the name."""
        tag = f"calib-n{self.samples}"
        if row.spec is None:  # a file given by path: its symbolic dims take --seq; other dirs hash
            tag += f"-seq{self.seq}"
            if row.path.resolve().parent != self.model_dir.resolve():
                tag += "-" + hashlib.sha1(str(row.path.resolve()).encode()).hexdigest()[:8]
        return self.model_dir / f"{row.path.stem}.{tag}"

    def calibration_set(self, row: systems.Row) -> list[dict[str, np.ndarray]]:
        """Batch-1 inputs of the kind the rows get (specs.make_feeds), seeds CALIB_SEED + i."""
        seeds = range(CALIB_SEED, CALIB_SEED + self.samples)
        if row.spec is None:
            return [specs.feeds_for_file(row.path, 1, self.seq, s) for s in seeds]
        return [specs.make_feeds(row.spec, 1, "fp32", s) for s in seeds]

    def _make(self, row: systems.Row, kind: str, folder: Path) -> Path:
        if kind == "table":
            return calibrate(row.path, self.calibration_set(row), folder)
        return quantize_qdq(row.path, self.calibration_set(row), folder / "qdq.onnx")

    def _prepare(self, row: systems.Row, kind: str) -> Prepared:
        key = (row.path.resolve(), kind)
        if key not in self.made:
            prep = Prepared()
            target = Path(f"{self.prefix(row)}.{'json' if kind == 'table' else QDQ_SUFFIX}")
            try:
                prep.seconds = _cached(target, row.path, lambda folder: self._make(row, kind, folder))
                prep.path = target
            except Exception as e:  # noqa: BLE001 - one line per system that needs it, the run goes on
                prep.error = f"{kind} for {row.path.name}: {type(e).__name__}: {e}"[:1500]
                prep.missing = isinstance(e, ImportError)
            self.made[key] = prep
        return self.made[key]

    def table(self, row: systems.Row) -> Path:
        return self._need(self._prepare(row, "table"))

    def qdq(self, row: systems.Row) -> Path:
        return self._need(self._prepare(row, "qdq"))

    @staticmethod
    def _need(prep: Prepared) -> Path:
        if prep.path is None:
            raise (systems.Unavailable if prep.missing else QuantError)(prep.error)
        return prep.path

    # -- what a system runs -----------------------------------------------------------------------------
    def ep_options(self, row: systems.Row) -> dict[str, str]:
        return {
            f"migraphx_{row.dtype}_enable": "1",
            "migraphx_int8_calibration_table_name": str(self.table(row)),
            "migraphx_int8_use_native_calibration_table": "0",
            **self.extra_options,
        }

    def system_row(self, row: systems.Row, system: str) -> systems.Row:
        """The row as ``system`` runs it (unchanged for fp32/fp16 rows); raises QuantError if a file it
        needs could not be made."""
        if row.dtype not in specs.QUANT_DTYPES:
            return row
        if system in QDQ_SYSTEMS:
            return dataclasses.replace(row, path=self.qdq(row))  # row.cache is shared, as for fp32
        if system.startswith("migraphx_ep"):
            s = row.settings
            options = {**self.ep_options(row), **s.ep_options}  # --ep-option still has the last word
            return dataclasses.replace(row, settings=dataclasses.replace(s, ep_options=options))
        return row

    def record(self, row: systems.Row, system: str) -> dict[str, Any]:
        """JSON-ready: the file the system ran, how it was made, the options that quantised."""
        rec: dict[str, Any] = {"fp32_file": row.path.name, "calibration_samples": self.samples}
        rec["calibration_seed"] = CALIB_SEED
        kind = "qdq" if system in QDQ_SYSTEMS else "table"
        prep = self.made.get((row.path.resolve(), kind))
        if prep is not None and prep.path is not None:
            rec.update({kind: prep.path.name, f"{kind}_made_s": prep.seconds})
        if system in QDQ_SYSTEMS:
            rec["runs"] = "QDQ model"
        elif system.startswith("migraphx_ep"):
            rec["runs"] = f"fp32 model, migraphx_{row.dtype}_enable=1"
            rec["ep_options"] = {
                k: v for k, v in self.ep_options(row).items() if not k.endswith("table_name")
            }
        return rec

    # -- the accuracy reference --------------------------------------------------------------------------
    def reference(self, row: systems.Row) -> tuple[list[np.ndarray] | None, str]:
        """The fp32 file's outputs at the row's inputs on ORT's CPU EP (once per file and batch)."""
        key = (row.path.resolve(), row.batch)
        if key not in self.refs:
            try:
                import onnxruntime as ort

                sess = ort.InferenceSession(str(row.path), providers=[systems.CPU_EP])
                outs = sess.run(None, {i.name: row.feeds[i.name] for i in sess.get_inputs()})
                self.refs[key] = ([np.asarray(o) for o in outs], "")
            except Exception as e:  # noqa: BLE001 - the accuracy entry says so; the timing still counts
                self.refs[key] = (None, f"no fp32 reference: {type(e).__name__}: {e}"[:500])
        return self.refs[key]
