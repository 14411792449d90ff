"""Run-time kernel sizes: shape numbers a generated kernel takes as arguments instead of literals.

Generators ask ``Params`` for each size; by default it hands back the name of a kernel parameter,
recording the value for ``KernelSpec.args``, so kernels of the same structure share one source across
shapes. ``MIGRAPHX_EP_RUNTIME_SIZES=0`` bakes every size into the source as a literal (one compile per
shape: the fully specialised program that bench/shapes.py compares with).
"""

from __future__ import annotations

import os

Dim = int | str  # a size baked into the source, or the name of a run-time kernel parameter (``Params``)


def c_dim(v: Dim) -> str:
    """A size as C: an unsigned literal, or a parameter's name."""
    return f"{v}u" if isinstance(v, int) else v


class Params:
    """Shape numbers a kernel takes as run-time arguments instead of literals in its source, so one
    compiled kernel serves every shape with the same structure (rank after collapsing, which strides are
    0 or 1, vector widths, index width): a new input shape then compiles nothing (the cache is keyed by
    source). ``ctype`` is the kernel's index type; the values go to ``KernelSpec.args``. With
    ``MIGRAPHX_EP_RUNTIME_SIZES=0`` the sizes are written into the source as literals."""

    def __init__(self, ctype: str) -> None:
        self.ctype = ctype
        self.values: list[int] = []
        # On by default since the whole-window pooling fix: on an H100 (bench/shapes.py) the PP-OCR
        # detector's steady state is 0.94-1.02x the baked program's (it was 1.8x when global pools took
        # their window sizes at run time), ResNet-50 and BERT-base within the run-to-run spread of
        # library timing. Generators keep literals wherever a size decides the loop structure.
        self.runtime = os.environ.get("MIGRAPHX_EP_RUNTIME_SIZES", "1") not in ("", "0")

    def __call__(self, value: int) -> str:
        if not self.runtime:
            return f"{int(value)}u"
        self.values.append(int(value))
        return f"p{len(self.values) - 1}"

    def i64(self, value: int) -> str:
        """A run-time size for signed 64-bit arithmetic (window positions, pads)."""
        return f"((i64){self(value)})"

    def stride(self, value: int) -> Dim:
        """0 and 1 stay in the source (broadcast and unit strides shape the code); others are run-time."""
        return value if value in (0, 1) else self(value)

    def decls(self) -> list[str]:
        return [f"const {self.ctype} p{k}" for k in range(len(self.values))]
