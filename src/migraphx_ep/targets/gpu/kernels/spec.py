"""What a generated kernel is, and the expression trees that fused pointwise kernels are built from.

The contract between the lowering (``targets/gpu/lowering.py``) and the generators in this package:

* A generator gets IR shapes. Input shapes may be any strided view (transposed, broadcast with stride
  0, sliced); the lowering has already offset the pointer for a slice. The output shape's strides say
  where each element goes (usually standard, sometimes a permuted layout such as NHWC).
* The kernel's parameters are one pointer per input, in order, then one per output, then (see below)
  an error slot and the run-time sizes ``args``. By default the pointwise, gather, pad, concat,
  pooling, reduction, softmax / layer-norm and resize generators take element counts, lens and
  strides other than 0 and 1 as ``args`` instead, keeping in the source only what shapes their loops
  (a size class: threads per row, registers per thread, the reduction schedule), so every shape of the
  same structure and class gives byte-identical source (NVRTC's cache is keyed by the source: a new
  shape compiles nothing). A resize kernel takes one more input after the op's own, its coordinate
  tables (``resize_table``, a weight the lowering adds).
  ``MIGRAPHX_EP_RUNTIME_SIZES=0`` makes every size a constant in the source (one compile per shape).
* Half and bfloat16 values are loaded to float, computed in float and rounded back to the IR type at
  every op boundary, which is what the ref target does (it evaluates narrow floats in float32 and
  rounds each op's result).
* A kernel with ``checks`` (an index out of range, an integer zero divisor: where the ref raises) takes
  one more parameter, ``i32* err``, after the outputs: its error slot. A failing check stores its code
  (1 + its position in ``checks``) there; the executable reads the slots back with the outputs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Union

from ....ir.dtypes import DType
from ....ir.operation import Op


@dataclass(frozen=True)
class Check:
    """A condition a kernel verifies at run time; ``error`` names the exception the host raises
    (``IndexError``, ``ZeroDivisionError``: what the ref target raises for the same input)."""

    error: str
    message: str


@dataclass(frozen=True)
class KernelSpec:
    name: str  # the extern "C" symbol
    source: str  # CUDA C++ including only the package's headers (headers.py), the prelude first
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0  # dynamic shared memory
    n_inputs: int = 1
    n_outputs: int = 1
    checks: tuple[Check, ...] = ()  # non-empty: the kernel takes an error slot (see the module doc)
    # Run-time sizes passed after the pointers (and the error slot), each an unsigned integer of
    # ``arg_bits``: shape numbers kept out of the source so other shapes reuse the compiled kernel.
    args: tuple[int, ...] = ()
    arg_bits: int = 32
    # The kernels the same op takes at other size classes (attention's key splits, the batch-1 twin of
    # pointwise and reduction kernels, a reduction's other schedules), under KERNEL_SYMBOL: made and
    # compiled only when this one really compiles, beside it (nvrtc.compile_images), so a later shape
    # finds them compiled.
    others: Callable[[], list[KernelSpec]] | None = field(default=None, compare=False, repr=False)


# The symbol every kernel is compiled under (``canonical``).
KERNEL_SYMBOL = "mx_kernel"


def canonical(spec: KernelSpec) -> KernelSpec:
    """``spec`` under the one symbol name ``KERNEL_SYMBOL``: kernels that differ only in their name (the
    same op in every layer of a transformer, or of a repeated block) then have one source, so they share
    one NVRTC compile, one image and one loaded function. The lowering's names (``k12_add``) stay on the
    original spec for error messages and traces."""
    if spec.name == KERNEL_SYMBOL:
        return spec
    return dataclasses.replace(
        spec, name=KERNEL_SYMBOL, source=replace_word(spec.source, spec.name, KERNEL_SYMBOL)
    )


def _word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def replace_word(text: str, word: str, new: str) -> str:
    """Every whole-word occurrence of the identifier ``word`` in ``text`` replaced by ``new`` (a regex
    word-boundary substitution, by ``str.find``): a regex over each kernel's ~13 KB source made binding
    BERT-base's 166 kernel steps cost ~60 ms per new shape; the name occurs a few times, so finding it
    is all the work."""
    parts, start, n = [], 0, len(word)
    at = text.find(word)
    while at >= 0:
        end = at + n
        whole = (at == 0 or not _word_char(text[at - 1])) and (end == len(text) or not _word_char(text[end]))
        if whole:
            parts += [text[start:at], new]
            start = end
        at = text.find(word, end)
    return "".join(parts) + text[start:] if parts else text


@dataclass(frozen=True)
class PwInput:
    """Element of the fused kernel's ``index``-th input (its strides come from the input's Shape)."""

    index: int


@dataclass(frozen=True, eq=False)
class PwConst:
    """A scalar constant (a literal that was broadcast); ``value`` is a Python number or bool.

    Equal when they are the same constant: ``0.0`` and ``-0.0`` (and ``1`` and ``True``) compare equal
    as numbers, yet ``x * -0.0`` is not ``x * 0.0``, and the code generator shares equal subexpressions."""

    value: float | int | bool
    type: DType

    def _ident(self) -> tuple:
        v = self.value
        return (self.type, type(v), v, math.copysign(1.0, v) if isinstance(v, float) else 0.0)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PwConst) and self._ident() == other._ident()

    def __hash__(self) -> int:
        return hash(self._ident())


@dataclass(frozen=True)
class PwOp:
    """``op`` (an IR pointwise op: add, erf, convert, where, clip, ...) applied to ``args``; its result
    element type is ``type`` (the IR instruction's)."""

    op: Op
    args: tuple[PwExpr, ...]
    type: DType


PwExpr = Union[PwInput, PwConst, PwOp]  # noqa: UP007 - a runtime alias, used in isinstance checks


class Unsupported(Exception):  # noqa: N818 - matches frontend.table.Unsupported
    """A generator cannot make a kernel for this op/shape/type; the message says why."""
