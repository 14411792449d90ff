"""Signal parsers: Hann/Hamming/BlackmanWindow, MelWeightMatrix (opset 17), DFT (17, 20), STFT (17).

Sizes, lengths, steps and axes fix output shapes, so they must be compile-time constants.
"""

from __future__ import annotations

from ...ir.dtypes import DType
from ...ops.signal import SIGNAL_TYPES
from ..context import NodeDesc, ParseContext, onnx_type
from ..table import Unsupported, onnx_op


def const_scalar(ctx: ParseContext, x, what: str) -> float | int:
    v = ctx.require_const(x, what)
    if v.size != 1:
        raise Unsupported(f"{what} must be a scalar")
    return v.reshape(()).item()


def float_out_type(node: NodeDesc) -> DType:
    t = onnx_type(int(node.attr("output_datatype", 1)))
    if t not in SIGNAL_TYPES:
        # integer windows truncate values computed in floating point: too precision-sensitive
        raise Unsupported(f"{node.op_type} output_datatype {t.name} (float types only)")
    return t


@onnx_op("HannWindow", "HammingWindow", "BlackmanWindow", min_opset=17)
def parse_window(ctx: ParseContext, node: NodeDesc, args):
    size = int(const_scalar(ctx, args[0], f"{node.op_type} size"))
    if size < 1:
        raise Unsupported(f"{node.op_type} size {size}")
    kind = node.op_type[: -len("Window")].lower()
    periodic = bool(node.attr("periodic", 1))
    if size == 1 and not periodic:
        raise Unsupported("symmetric window of size 1 divides by zero")
    return ctx.add("window", kind=kind, size=size, periodic=periodic, out_type=float_out_type(node))


@onnx_op("MelWeightMatrix", min_opset=17)
def parse_mel_weight_matrix(ctx: ParseContext, node: NodeDesc, args):
    names = ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz")
    v = {n: const_scalar(ctx, a, f"MelWeightMatrix {n}") for n, a in zip(names, args, strict=True)}
    if args[0].shape.type not in (DType.int32_type, DType.int64_type):
        raise Unsupported("MelWeightMatrix integer inputs of unexpected type")
    lo, hi = float(v["lower_edge_hertz"]), float(v["upper_edge_hertz"])
    nyquist = int(v["sample_rate"]) / 2
    if not 0 <= lo < hi <= nyquist or min(int(v[n]) for n in names[:3]) < 1:
        raise Unsupported(f"MelWeightMatrix arguments out of range: {v}")
    return ctx.add(
        "mel_weight_matrix",
        num_mel_bins=int(v["num_mel_bins"]),
        dft_length=int(v["dft_length"]),
        sample_rate=int(v["sample_rate"]),
        lower_edge_hertz=lo,
        upper_edge_hertz=hi,
        out_type=float_out_type(node),
    )


@onnx_op("DFT", min_opset=17)
def parse_dft(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    length_in = args[1] if len(args) > 1 else None
    if x.shape.type not in SIGNAL_TYPES:
        raise Unsupported(f"DFT of {x.shape.type.name}")
    rank = x.shape.ndim()
    if rank < 2 or x.shape.lens[-1] not in (1, 2):
        raise Unsupported(f"DFT input dims {list(x.shape.lens)}: last dim must be 1 or 2")
    if ctx.opset >= 20:
        a = args[2] if len(args) > 2 else None
        axis = -2 if a is None else int(const_scalar(ctx, a, "DFT axis"))
    else:
        axis = int(node.attr("axis", 1))
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise Unsupported(f"DFT axis {axis} for rank {rank}")
    axis %= rank
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    if onesided and x.shape.lens[-1] != (2 if inverse else 1):
        raise Unsupported("one-sided DFT needs a real signal (forward) or a complex spectrum (inverse)")
    n = x.shape.lens[axis]
    if length_in is not None:
        length = int(const_scalar(ctx, length_in, "DFT dft_length"))
    else:
        length = 2 * (n - 1) if inverse and onesided else n
    if length < 1:
        raise Unsupported(f"DFT length {length}")
    if inverse and onesided and length // 2 + 1 > n:
        # numpy zero-fills the missing bins, ORT 1.31 does not: no agreed answer
        raise Unsupported(f"inverse one-sided DFT of length {length} needs {length // 2 + 1} bins, got {n}")
    return ctx.add("dft", [x], axis=axis, inverse=inverse, onesided=onesided, length=length)


@onnx_op("STFT", min_opset=17)
def parse_stft(ctx: ParseContext, node: NodeDesc, args):
    x, step = args[0], args[1]
    window = args[2] if len(args) > 2 else None
    fl_in = args[3] if len(args) > 3 else None
    if x.shape.type not in SIGNAL_TYPES:
        raise Unsupported(f"STFT of {x.shape.type.name}")
    if x.shape.ndim() != 3 or x.shape.lens[2] not in (1, 2):
        raise Unsupported(f"STFT signal dims {list(x.shape.lens)}")
    onesided = bool(node.attr("onesided", 1))
    if onesided and x.shape.lens[2] != 1:
        raise Unsupported("one-sided STFT of a complex signal")
    frame_step = int(const_scalar(ctx, step, "STFT frame_step"))
    fl = None if fl_in is None else int(const_scalar(ctx, fl_in, "STFT frame_length"))
    if window is not None:
        if window.shape.ndim() != 1 or window.shape.type != x.shape.type:
            raise Unsupported("STFT window must be 1-D of the signal's type")
        if fl is not None and fl != window.shape.lens[0]:
            raise Unsupported("STFT frame_length differs from the window length")
        fl = window.shape.lens[0]
    if fl is None:
        raise Unsupported("STFT without window or frame_length")
    if frame_step < 1 or not 1 <= fl <= x.shape.lens[1]:
        raise Unsupported(f"STFT frame_step {frame_step} / frame_length {fl} for signal {list(x.shape.lens)}")
    ins = [x] + ([window] if window is not None else [])
    return ctx.add("stft", ins, frame_step=frame_step, frame_length=fl, onesided=onesided)
