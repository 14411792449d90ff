"""dft as one matrix product with a constant cos/sin matrix (``ops/signal.py`` is the meaning).

The signal's real and imaginary parts sit side by side along the contraction, the output's along the
columns, so a complex transform is one ``dot``: [xr | xi] @ [[C, S], [-S, C]] = [yr | yi] with
C = cos(2 pi k t / n), S = -sin(...) for the forward transform. It runs in the ref's type (float32
below float64, double for double) and rounds once. The twiddles are computed in float64 from
(k t mod n), exact at the quarter turns (0, +-1), so terms that cancel exactly in the ref (the imaginary
part of a real signal's DC and Nyquist bins) cancel exactly here too. Only the points the transform
reads enter the matrix: a longer ``length`` zero-pads (those rows would multiply zeros), a shorter one
truncates.

The complex inverse (not one-sided) is refused: numpy's ifft leaves about one ulp of its sums on outputs
that cancel to zero (ONNX's test_dft_inverse_opset19 expects 1.9e-7 where the exact answer, and this
product, give 0), beyond ONNX's atol of 1e-7; no matrix product reproduces pocketfft's rounding.
"""

from __future__ import annotations

import numpy as np

from ....ir.dtypes import DType
from ....ir.instruction import Instruction
from ..kernels.spec import Unsupported
from .builder import Builder
from .linalg import acc_dtype_of

MATRIX_LIMIT = 1 << 22  # elements of the constant matrix (16 MiB of float32): a 1024-point complex dft


def twiddles(n: int, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of 2 pi k t / n for t < rows, k < cols, in float64, exact at quarter turns."""
    m = np.outer(np.arange(rows), np.arange(cols)) % n
    ang = 2 * np.pi * m / n
    c, s = np.cos(ang), np.sin(ang)
    quarter = (4 * m) % n == 0
    q = (4 * m // n) % 4
    c = np.where(quarter, np.array([1.0, 0.0, -1.0, 0.0])[q], c)
    s = np.where(quarter, np.array([0.0, 1.0, 0.0, -1.0])[q], s)
    return c, s


def _matrix(op: object, n: int, used: int, complex_in: bool) -> np.ndarray:
    """The (parts_in * used, parts_out * bins) matrix of the transform (float64)."""
    inverse, onesided = op.inverse, op.onesided  # type: ignore[attr-defined]
    if inverse and onesided:
        # irfft: y[t] = sum_k w_k (Xr[k] cos - Xi[k] sin), w = 1 at DC and Nyquist, else 2 (the bins
        # above n//2 are the conjugates). Their sines are exact zeros, so the imaginary parts of those
        # two bins are ignored, as pocketfft's c2r ignores them.
        bins = n // 2 + 1
        if used < bins:
            raise Unsupported(f"inverse one-sided dft of length {n} reads {bins} bins, the input has {used}")
        c, s = twiddles(n, bins, n)
        w = np.full((bins, 1), 2.0)
        w[0] = 1.0
        if n % 2 == 0:
            w[-1] = 1.0
        return np.concatenate([w * c, -w * s])
    bins = n // 2 + 1 if onesided else n
    c, s = twiddles(n, used, bins)
    s = -s  # forward: e^(-i theta)
    top = np.concatenate([c, s], axis=1)
    return np.concatenate([top, np.concatenate([-s, c], axis=1)]) if complex_in else top


def decompose_dft(b: Builder, ins: Instruction) -> Instruction:
    op = ins.op
    x = ins.inputs[0]
    rank, ax = x.shape.ndim(), op.axis  # type: ignore[attr-defined]
    n = op.length or x.shape.lens[ax]  # type: ignore[attr-defined]
    inverse, onesided = op.inverse, op.onesided  # type: ignore[attr-defined]
    parts = x.shape.lens[-1]
    if inverse and not onesided:
        raise Unsupported("inverse complex dft: numpy's rounding of outputs that cancel to 0 is beyond atol")
    acc = acc_dtype_of(ins.shape.type)
    if acc not in (DType.float_type, DType.double_type):
        raise Unsupported(f"dft of {x.shape.type.name}")
    # the points the transform reads: n of the signal, or the n//2 + 1 lowest bins of an irfft
    used = min(x.shape.lens[ax], n // 2 + 1 if inverse and onesided else n)
    xs = b.add("slice", b.convert(x, acc), axes=[ax], starts=[0], ends=[used])
    # (rest..., parts, used) -> (R, parts * used): real parts, then imaginary ones, along the contraction
    rest = [k for k in range(rank - 1) if k != ax]
    xt = b.transpose(xs, [*rest, rank - 1, ax])
    rows = int(np.prod([x.shape.lens[k] for k in rest], dtype=np.int64))
    xm = b.reshape(xt, [1, rows, parts * used])
    mat = _matrix(op, n, used, parts == 2)
    if mat.size > MATRIX_LIMIT:
        raise Unsupported(f"dft of {n} points: a {list(mat.shape)} matrix (over {MATRIX_LIMIT} elements)")
    y = b.add("dot", xm, b.literal(mat.reshape(1, *mat.shape), acc))
    if inverse:  # irfft: numpy scales the transform's result by 1/n (after the sums, not inside them)
        y = b.pw("mul", y, 1.0 / n)
    out_parts, bins = ins.shape.lens[-1], ins.shape.lens[ax]
    y = b.reshape(y, [*(x.shape.lens[k] for k in rest), out_parts, bins])
    # back to the input's order: the bins at the axis, the parts last
    order = [*rest, rank - 1, ax]
    perm = [order.index(k) for k in range(rank)]
    return b.convert(b.transpose(y, perm), ins.shape.type)
