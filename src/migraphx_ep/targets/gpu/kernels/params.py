"""Run-time kernel sizes: shape numbers a generated kernel takes as arguments instead of literals.

Generators ask ``Params`` for each size; by default it hands back a literal (one compile per shape), and
with ``MIGRAPHX_EP_RUNTIME_SIZES=1`` the name of a kernel parameter, recording the value for
``KernelSpec.args``, so kernels of the same structure share one source across shapes.
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
    source). ``ctype`` is the kernel's index type; the values go to ``KernelSpec.args``. Without
    ``MIGRAPHX_EP_RUNTIME_SIZES=1`` the sizes are written into the source as literals (see below)."""

    def __init__(self, ctype: str) -> None:
        self.ctype = ctype
        self.values: list[int] = []
        # Opt-in (MIGRAPHX_EP_RUNTIME_SIZES=1) until a measured regression is understood: on an H100 the
        # PP-OCR detector's CUDA graph replays in 8.1 ms with run-time sizes vs 2.0 ms with every size
        # baked into the source, while ResNet-50 and BERT-base stay within 3%. Off: one compile per shape.
        self.runtime = os.environ.get("MIGRAPHX_EP_RUNTIME_SIZES", "0") not in ("", "0")

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
