"""convolution_backwards (ConvTranspose) as a stride-1 convolution (``ops/nn.py`` is the meaning).

y = conv(x with s-1 zeros between elements, padded by (K-1)*d minus the op's padding, weights with
input and output channels swapped per group and the window flipped). Both the zero insertion and the
padding (negative: a crop; a negative end padding, output_padding, adds zeros) are ``pad`` kernels, so
the convolution itself is unpadded. Products and sums are the ref's (float32 accumulation for half).
"""

from __future__ import annotations

from ....ir.instruction import Instruction
from .builder import Builder


def decompose_convolution_backwards(b: Builder, ins: Instruction) -> Instruction:
    op = ins.op
    x, w = ins.inputs
    n, c, *lens = x.shape.lens
    _, mg, *ks = w.shape.lens
    k, g = len(lens), op.group  # type: ignore[attr-defined]
    p, s, d = op.padding or (0,) * 2 * k, op.stride or (1,) * k, op.dilation or (1,) * k  # type: ignore[attr-defined]
    if any(st > 1 for st in s):  # (.., L, 1, ..) padded to (.., L, s, ..) and merged: s-1 zeros after each
        split = [n, c, *[v for ln in lens for v in (ln, 1)]]
        pads = [0] * (2 * len(split))
        for i in range(k):
            pads[len(split) + 3 + 2 * i] = s[i] - 1
        x = b.add("pad", b.reshape(x, split), pads=pads)
        x = b.reshape(x, [n, c, *[ln * st for ln, st in zip(lens, s, strict=True)]])
    edge = [(ks[i] - 1) * d[i] for i in range(k)]
    begin = [edge[i] - p[i] for i in range(k)]
    end = [edge[i] - p[k + i] - (s[i] - 1) for i in range(k)]  # the last s-1 zeros are not data
    if any(begin) or any(end):
        x = b.add("pad", x, pads=[0, 0, *begin, 0, 0, *end])
    # (C, M/g, K) -> (g*M/g, C/g, K) flipped: the forward convolution's weights
    wt = b.reshape(w, [g, c // g, mg, *ks])
    wt = b.reshape(b.add("contiguous", b.transpose(wt, [0, 2, 1, *range(3, 3 + k)])), [g * mg, c // g, *ks])
    wt = b.add("reverse", wt, axes=list(range(2, 2 + k)))
    return b.add("convolution", x, wt, padding=[0] * 2 * k, stride=[1] * k, dilation=list(d), group=g)
