"""int8/fp8 calibration tables for the EP: read, check, and quantise a program with their scales.

Formats (``migraphx_int8_use_native_calibration_table``):

- native (1): TensorRT's text table, what the real MIGraphX and TensorRT EPs read natively::

      TRT-8601-EntropyCalibration2
      input: 3c010204            <- float32 bits of the scale; the tensor's range is scale * 127

- otherwise (0): what ``onnxruntime.quantization``'s ``write_calibration_table`` writes: the JSON
  ``calibration.json`` (``{"data": {name: {"lowest": .., "highest": ..}}}``, values plain or numpy-encoded;
  also the older ``{name: [min, max]}`` and ``{name: {"lowest": .., "highest": ..}}``), or the
  flatbuffers ``calibration.flatbuffers`` the real MIGraphX EP reads (one range per tensor).

A tensor's range is its largest magnitude; its scale is range / 127 (int8) or range / 448 (fp8 E4M3),
symmetric, zero point 0 (MIGraphX's ``quantize_int8``). Errors name the file and the line (entry).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.dtypes import DType
from ..ir.instruction import Instruction
from ..ir.program import Program
from ..passes.dead_code_elimination import dead_code_elimination
from ..passes.simplify_qdq import simplify_qdq
from ..quantize import calibrate, quantize_static
from .options import EpOptions

log = logging.getLogger("migraphx_ep")

TABLE_OPTION = "migraphx_int8_calibration_table_name"
NATIVE_OPTION = "migraphx_int8_use_native_calibration_table"
# Ops that only move or select elements: a tensor's range bounds theirs, so a quantised input reached
# through them takes the range of the named tensor behind them (MatMul broadcasts, Gemm transposes).
RANGE_KEEPING = frozenset(
    {"reshape", "transpose", "multibroadcast", "broadcast", "squeeze", "unsqueeze", "flatten", "contiguous"}
    | {"slice", "identity", "step"}
)


class CalibrationError(ValueError):
    """A calibration table that is missing, unreadable or malformed (the message names file and line)."""


@dataclass
class CalibrationTable:
    path: str
    format: str  # "native", "json" or "flatbuffers"
    ranges: dict[str, float]  # tensor name -> largest magnitude
    digest: str  # SHA-256 of the file's bytes
    warned: set[str] = field(default_factory=set)  # tensors already reported missing


# -- reading ---------------------------------------------------------------------------------------
def _range(lo: Any, hi: Any, where: str) -> float:
    try:
        lo_f, hi_f = float(lo), float(hi)
    except (TypeError, ValueError):
        raise CalibrationError(f"{where}: range [{lo!r}, {hi!r}] is not two numbers") from None
    if not (math.isfinite(lo_f) and math.isfinite(hi_f)) or lo_f > hi_f:
        raise CalibrationError(f"{where}: range [{lo_f}, {hi_f}] is not a finite [lowest, highest]")
    return max(abs(lo_f), abs(hi_f))


def parse_native(text: str, path: str) -> dict[str, float]:
    """TensorRT's ``name: <8 hex digits>`` lines after a ``TRT-...`` header."""
    lines = text.splitlines()
    if not lines or "TRT-" not in lines[0].split(":")[0]:
        raise CalibrationError(
            f"{path}:1: not a TensorRT-style calibration table (the first line must be like "
            f"'TRT-8601-EntropyCalibration2'); for onnxruntime.quantization's JSON or flatbuffers "
            f"table set {NATIVE_OPTION}=0"
        )
    ranges: dict[str, float] = {}
    first_line: dict[str, int] = {}
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        name, sep, bits = line.rpartition(":")  # tensor names may hold ':' themselves ("x:0")
        name, bits = name.strip(), bits.strip()
        if not sep or not name:
            raise CalibrationError(f"{path}:{n}: expected 'tensor_name: <8 hex digits>', got {line!r}")
        if not 1 <= len(bits) <= 8 or any(c not in "0123456789abcdefABCDEF" for c in bits):
            raise CalibrationError(
                f"{path}:{n}: {name!r}: scale {bits!r} is not 1-8 hex digits (float32 bits)"
            )
        scale = struct.unpack(">f", int(bits, 16).to_bytes(4, "big"))[0]
        if not math.isfinite(scale) or scale < 0:
            raise CalibrationError(
                f"{path}:{n}: {name!r}: scale {scale} (0x{bits}) is not a finite non-negative float"
            )
        if name in first_line:
            raise CalibrationError(
                f"{path}:{n}: tensor {name!r} listed again (first on line {first_line[name]})"
            )
        first_line[name] = n
        ranges[name] = scale * 127.0  # TensorRT stores range / 127
    return ranges


def _json_number(v: Any, where: str) -> Any:
    """A plain number, or numpy's encoding ``{"data": [x], "dtype": .., "CLS": "numpy.array"}``."""
    if isinstance(v, dict) and "data" in v:
        data = v["data"]
        flat = data if isinstance(data, list) else [data]
        if len(flat) != 1 or isinstance(flat[0], list):
            raise CalibrationError(f"{where}: {len(flat)} values where one per-tensor value is needed")
        return flat[0]
    return v


def parse_json(text: str, path: str) -> dict[str, float]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise CalibrationError(f"{path}:{e.lineno}: not valid JSON: {e.msg} (column {e.colno})") from None
    if isinstance(doc, dict) and doc.get("CLS") == "TensorsData":
        doc = doc.get("data")  # onnxruntime.quantization >= 1.2x: TensorsData.to_dict()
    if not isinstance(doc, dict):
        raise CalibrationError(f"{path}:1: expected a JSON object of tensor name -> range")

    def where(name: str) -> str:
        at = text.find(json.dumps(name))
        return f"{path}:{text.count(chr(10), 0, at) + 1 if at >= 0 else 1}: tensor {name!r}"

    ranges: dict[str, float] = {}
    for name, v in doc.items():
        if isinstance(v, dict) and "lowest" in v and "highest" in v:
            lo, hi = _json_number(v["lowest"], where(name)), _json_number(v["highest"], where(name))
        elif isinstance(v, list | tuple) and len(v) == 2:
            lo, hi = v
        else:
            raise CalibrationError(
                f"{where(name)}: expected [min, max] or {{'lowest': .., 'highest': ..}}, got {str(v)[:80]}"
            )
        ranges[name] = _range(lo, hi, where(name))
    return ranges


def parse_flatbuffers(data: bytes, path: str) -> dict[str, float]:
    """ORT's ``calibration.flatbuffers`` (TrtTable of key/value strings; the value is a range)."""
    try:
        from onnxruntime.quantization.CalTableFlatBuffers.TrtTable import TrtTable
    except ImportError as e:  # pragma: no cover - part of every onnxruntime wheel
        raise CalibrationError(
            f"{path}: reading flatbuffers tables needs onnxruntime.quantization: {e}"
        ) from e
    what = (
        f"{path}: neither JSON nor onnxruntime.quantization's calibration flatbuffers"
        f" (a TensorRT-style text table needs {NATIVE_OPTION}=1)"
    )
    if len(data) < 8:
        raise CalibrationError(what)
    try:
        table = TrtTable.GetRootAsTrtTable(data, 0)
        entries = [(table.Dict(i).Key(), table.Dict(i).Value()) for i in range(table.DictLength())]
    except Exception:  # noqa: BLE001 - flatbuffers reads unchecked offsets: any failure means "not one"
        raise CalibrationError(what) from None
    ranges: dict[str, float] = {}
    for i, (key, value) in enumerate(entries):
        if key is None or value is None:
            raise CalibrationError(f"{what} (entry {i} has no key or value)")
        try:
            name, text = key.decode("utf-8"), value.decode("utf-8")
            r = float(text)
        except (UnicodeDecodeError, ValueError):
            raise CalibrationError(f"{path}: entry {i}: {key!r}: {value!r} is not a number") from None
        # ORT writes max(highest, lowest), not the largest magnitude: a tensor whose negative side is
        # wider is clipped there, as with the real EP. JSON tables keep both ends.
        ranges[name] = _range(-abs(r), abs(r), f"{path}: entry {i}: tensor {name!r}")
    return ranges


def resolve_path(name: str, options: EpOptions) -> str:
    """The table's path: as given (absolute, or relative to the working directory), else inside
    ``migraphx_model_cache_dir`` (the real EP looks in ORT_MIGRAPHX_CACHE_PATH, our legacy alias)."""
    tried = [os.path.abspath(name)]
    if not os.path.isabs(name) and options.model_cache_dir:
        tried.append(os.path.abspath(os.path.join(options.model_cache_dir, name)))
    for p in tried:
        if os.path.isfile(p):
            return p
    raise CalibrationError(f"{TABLE_OPTION}={name!r}: no such file (looked at {', '.join(tried)})")


def read_table(path: str, native: bool) -> CalibrationTable:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CalibrationError(f"{path}: cannot read the calibration table: {e.strerror or e}") from None
    if native or data.lstrip()[:1] == b"{":
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            raise CalibrationError(f"{path}:{line}: not UTF-8 text (byte {e.start})") from None
        fmt, ranges = ("native", parse_native(text, path)) if native else ("json", parse_json(text, path))
    else:
        fmt, ranges = "flatbuffers", parse_flatbuffers(data, path)
    return CalibrationTable(path, fmt, ranges, hashlib.sha256(data).hexdigest())


def load_table(options: EpOptions) -> CalibrationTable | None:
    """The table int8/fp8 need (None when neither is on); errors name the option or the file."""
    if not (options.int8_enable or options.fp8_enable):
        return None
    mode = "migraphx_int8_enable" if options.int8_enable else "migraphx_fp8_enable"
    if not options.int8_calibration_table_name:
        raise CalibrationError(
            f"{mode}=1 needs {TABLE_OPTION} (or ORT_MIGRAPHX_INT8_CALIBRATION_TABLE_NAME): a calibration "
            f"table of the model's tensor ranges, e.g. onnxruntime.quantization's calibration.json"
        )
    path = resolve_path(options.int8_calibration_table_name, options)
    table = read_table(path, options.int8_use_native_calibration_table)
    if not table.ranges:
        raise CalibrationError(f"{path}: the calibration table lists no tensors")
    log.info("%s: %d tensor ranges from %s (%s)", mode, len(table.ranges), path, table.format)
    return table


# -- quantising --------------------------------------------------------------------------------------
def _named(
    site: Instruction, names: Mapping[int, list[str]], table: CalibrationTable
) -> tuple[str | None, str]:
    """(name found in the table or None, a label for messages), looking through range-keeping ops."""
    ins: Instruction | None = site
    label = ""
    while ins is not None:
        for n in names.get(id(ins), ()):
            if n in table.ranges:
                return n, n
            label = label or n
        ins = ins.inputs[0] if ins.name in RANGE_KEEPING and ins.inputs else None
    return None, label or f"an unnamed {site.name} result"


def quantize_with_table(
    prog: Program, tensors: Mapping[str, Instruction], table: CalibrationTable, qtype: DType, where: str
) -> int:
    """Quantise ``prog``'s dot/convolution inputs to ``qtype`` and rewrite them into quant_dot /
    quant_convolution. Ranges: constants (weights) from their values; tensors named in the table from
    it; any other tensor is calibrated on generated inputs, as MIGraphX does for calibration data that
    lacks a parameter, with one warning per tensor naming it."""
    names: dict[int, list[str]] = {}
    for n, ins in tensors.items():
        names.setdefault(id(ins), []).append(n)

    def ranges(sites: list[Instruction]) -> list[float]:
        out: list[float | None] = []
        missing: list[tuple[int, Instruction, str]] = []
        for i, s in enumerate(sites):
            value = s.eval()
            if value is not None:  # a weight, or a constant expression of weights: exact
                finite = np.abs(np.asarray(value, np.float64))
                finite = finite[np.isfinite(finite)]
                out.append(float(finite.max()) if finite.size else 0.0)
                continue
            name, label = _named(s, names, table)
            if name is not None:
                out.append(table.ranges[name])
                continue
            out.append(None)
            missing.append((i, s, label))
        if missing:
            fresh = sorted({label for _, _, label in missing} - table.warned)
            if fresh:
                table.warned.update(fresh)
                log.warning(
                    "%s: calibration table %s has no range for %s; their scales come from generated "
                    "inputs (as MIGraphX calibrates without data), which may not match real data",
                    where,
                    table.path,
                    ", ".join(repr(n) for n in fresh),
                )
            for (i, _, _), mx in zip(missing, calibrate(prog, [s for _, s, _ in missing]), strict=True):
                out[i] = mx
        return [float(x) for x in out]  # type: ignore[arg-type]

    count = quantize_static(prog, qtype, ranges)
    main = prog.get_main_module()
    if simplify_qdq(main):
        dead_code_elimination(main)
    return count


__all__ = ["CalibrationError", "CalibrationTable", "load_table", "quantize_with_table", "read_table"]
