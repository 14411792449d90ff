"""Signal ops: window functions, the mel filter bank, DFT and STFT.

Complex tensors are ONNX's real form: a trailing dimension of 2 (real, imaginary), or 1 for a real
signal. Transforms run in numpy.fft at the input's precision (complex64 below float64, as ORT's float
kernels and ONNX's reference do, so exact zeros carry the same rounding noise); windows and the mel
matrix are computed in float64 and rounded once.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..ir.dtypes import DType
from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, ShapeError, check_shapes

SIGNAL_TYPES = frozenset({DType.half_type, DType.float_type, DType.double_type, DType.bf16_type})
WINDOWS = ("hann", "hamming", "blackman")


@register_op
@op_class
class Window(Op):
    """A window of ``size`` points: hann, hamming (alpha 25/46) or blackman, periodic or symmetric."""

    name: ClassVar[str] = "window"
    kind: str = "hann"
    size: int = 0
    periodic: bool = True
    out_type: DType = DType.float_type

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "out_type", DType(self.out_type))

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(0)
        if self.kind not in WINDOWS or self.size < 0 or self.out_type not in SIGNAL_TYPES:
            raise ShapeError(f"window: bad kind {self.kind!r}, size {self.size} or type {self.out_type.name}")
        return Shape(self.out_type, (self.size,))

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        n = np.arange(self.size, dtype=np.float64)
        with np.errstate(all="ignore"):
            # ONNX: the symmetric form divides by N-1 (so size 1 gives 0/0, as in the spec)
            ph = 2 * np.pi * n / (self.size if self.periodic else self.size - 1)
        if self.kind == "hann":
            w = 0.5 - 0.5 * np.cos(ph)
        elif self.kind == "hamming":
            w = 25 / 46 - (21 / 46) * np.cos(ph)
        else:
            w = 0.42 - 0.5 * np.cos(ph) + 0.08 * np.cos(2 * ph)
        return w.astype(out.dtype)

    def attributes(self) -> dict:
        return {**super().attributes(), "out_type": int(self.out_type)}


@register_op
@op_class
class MelWeightMatrix(Op):
    """ONNX MelWeightMatrix: (dft_length//2 + 1, num_mel_bins) triangular filters (ORT's bin rounding)."""

    name: ClassVar[str] = "mel_weight_matrix"
    num_mel_bins: int = 0
    dft_length: int = 0
    sample_rate: int = 0
    lower_edge_hertz: float = 0.0
    upper_edge_hertz: float = 0.0
    out_type: DType = DType.float_type

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "out_type", DType(self.out_type))

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(0)
        if self.num_mel_bins < 1 or self.dft_length < 1 or self.sample_rate < 1:
            raise ShapeError("mel_weight_matrix: num_mel_bins, dft_length and sample_rate must be positive")
        return Shape(self.out_type, (self.dft_length // 2 + 1, self.num_mel_bins))

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        def mel(hz: float) -> float:
            return 2595 * np.log10(1 + hz / 700)

        lo, hi = mel(self.lower_edge_hertz), mel(self.upper_edge_hertz)
        nb = self.num_mel_bins + 2
        step = (hi - lo) / nb
        hz = 700 * (10 ** ((lo + step * np.arange(nb)) / 2595) - 1)
        bins = np.floor((self.dft_length + 1) * hz / self.sample_rate).astype(np.int64)
        w = np.zeros(out.lens, np.float64)
        for i in range(self.num_mel_bins):
            left, center, right = bins[i], bins[i + 1], bins[i + 2]
            if center == left:
                w[center, i] = 1
            else:
                j = np.arange(left, center + 1)
                w[j, i] = (j - left) / (center - left)
            if right > center:
                j = np.arange(center, right)
                w[j, i] = (right - j) / (right - center)
        return w.astype(out.dtype)

    def attributes(self) -> dict:
        return {**super().attributes(), "out_type": int(self.out_type)}


def to_complex(x: np.ndarray) -> np.ndarray:
    ct = np.complex128 if x.dtype == np.float64 else np.complex64
    c = x[..., 0].astype(ct)
    if x.shape[-1] == 2:
        c.imag = x[..., 1]
    return c


def from_complex(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.stack((y.real, y.imag), axis=-1).astype(dtype)


def dft_out_len(n: int, length: int, inverse: bool, onesided: bool) -> tuple[int, int]:
    """(size along the axis, trailing complex dim) of a DFT's output."""
    if inverse and onesided:
        return length, 1
    return (length // 2 + 1 if onesided else length), 2


@register_op
@op_class
class Dft(Op):
    """ONNX DFT along ``axis`` (never the trailing complex dim) with ``length`` points (0: the axis size).

    Forward one-sided takes a real signal; inverse one-sided (irfft) takes the n//2 + 1 lowest bins of a
    complex spectrum and returns a real signal; inverse is scaled by 1/length.
    """

    name: ClassVar[str] = "dft"
    axis: int = 1
    inverse: bool = False
    onesided: bool = False
    length: int = 0

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1).types(SIGNAL_TYPES).min_ndims(2)
        x = inputs[0]
        if not 0 <= self.axis < x.ndim() - 1 or x.lens[-1] not in (1, 2) or self.length < 0:
            raise ShapeError(f"dft: axis {self.axis} / length {self.length} do not fit {list(x.lens)}")
        if self.onesided and x.lens[-1] != (2 if self.inverse else 1):
            raise ShapeError("dft: one-sided forward needs a real signal, inverse a complex one")
        n = self.length or x.lens[self.axis]
        size, last = dft_out_len(x.lens[self.axis], n, self.inverse, self.onesided)
        lens = list(x.lens)
        lens[self.axis], lens[-1] = size, last
        return Shape(x.type, lens)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = to_complex(args[0])
        n = self.length or args[0].shape[self.axis]
        if self.inverse and self.onesided:
            return np.fft.irfft(x, n=n, axis=self.axis)[..., None].astype(out.dtype)
        y = np.fft.ifft(x, n=n, axis=self.axis) if self.inverse else np.fft.fft(x, n=n, axis=self.axis)
        if self.onesided:
            y = np.take(y, np.arange(n // 2 + 1), axis=self.axis)
        return from_complex(y, out.dtype)


@register_op
@op_class
class Stft(Op):
    """ONNX STFT of signal (B, L, 1|2) with optional window (frame_length,): (B, frames, bins, 2).

    frames = 1 + (L - frame_length) // frame_step; each frame is multiplied by the window (ones if
    absent) and transformed with frame_length points; ``onesided`` keeps frame_length//2 + 1 bins.
    """

    name: ClassVar[str] = "stft"
    frame_step: int = 1
    frame_length: int = 0
    onesided: bool = True

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1, 2).same_type().types(SIGNAL_TYPES)
        x = inputs[0]
        fl = self.frame_length
        if x.ndim() != 3 or x.lens[2] not in (1, 2) or self.frame_step < 1 or not 1 <= fl <= x.lens[1]:
            raise ShapeError(f"stft: signal {list(x.lens)}, step {self.frame_step}, frame length {fl}")
        if self.onesided and x.lens[2] != 1:
            raise ShapeError("stft: one-sided needs a real signal")
        if len(inputs) == 2 and inputs[1].lens != (fl,):
            raise ShapeError(f"stft: window {list(inputs[1].lens)} does not match frame length {fl}")
        frames = 1 + (x.lens[1] - fl) // self.frame_step
        return Shape(x.type, (x.lens[0], frames, fl // 2 + 1 if self.onesided else fl, 2))

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = to_complex(args[0])
        fl, frames = self.frame_length, out.lens[1]
        idx = np.arange(frames)[:, None] * self.frame_step + np.arange(fl)[None, :]
        f = x[:, idx]  # (B, frames, fl)
        if len(args) == 2:
            f = f * args[1].astype(f.real.dtype)
        y = np.fft.fft(f, n=fl, axis=-1)[..., : out.lens[2]]
        return from_complex(y, out.dtype)


__all__ = ["SIGNAL_TYPES"]
