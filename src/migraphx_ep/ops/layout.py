"""Ops that move or reinterpret elements: col2im (fold), tensor_scatter (KV-cache write), bit_cast.

Like the data-movement ops, an index that is out of range at run time is an error, never a silent
write elsewhere.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from ..ir.dtypes import DType
from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, check_shapes
from .base import ALL_TYPES, NUMERIC_TYPES
from .pointwise import NARROW_FLOATS


@register_op
@op_class
class Col2Im(Op):
    """ONNX Col2Im: (N, C*prod(block), L) column blocks summed back into an (N, C, *image) image.

    Column ``c*prod(block) + j`` holds kernel offset ``j`` (C order over ``block_shape``) of channel
    ``c``; its ``L`` entries are the sliding-block positions in C order. ``pads`` is [begins..., ends...].
    Narrow floats sum in float32 and round once (as ORT's CPU kernel); integers wrap.
    """

    name: ClassVar[str] = "col2im"
    image_shape: tuple[int, ...] = ()
    block_shape: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()

    def blocks(self) -> list[int]:
        """Sliding-block count per spatial dim (the convolution output size)."""
        k = len(self.image_shape)
        return [
            (
                self.image_shape[i]
                + self.pads[i]
                + self.pads[i + k]
                - self.dilations[i] * (self.block_shape[i] - 1)
                - 1
            )
            // self.strides[i]
            + 1
            for i in range(k)
        ]

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        c = check_shapes(self.name, inputs).has(1).types(NUMERIC_TYPES).ndims(3)
        k = len(self.image_shape)
        if k < 1 or any(len(a) != k for a in (self.block_shape, self.strides, self.dilations)):
            raise c.fail(
                f"image_shape, block_shape, strides and dilations need one value per spatial dim ({k})"
            )
        if len(self.pads) != 2 * k:
            raise c.fail(f"pads need {2 * k} values, got {list(self.pads)}")
        if min(self.image_shape + self.block_shape + self.strides + self.dilations) < 1 or min(self.pads) < 0:
            raise c.fail("image/block sizes, strides and dilations must be >= 1 and pads >= 0")
        n, ck, length = inputs[0].lens
        kk = math.prod(self.block_shape)
        nb = self.blocks()
        if ck % kk or min(nb) < 1 or length != math.prod(nb):
            raise c.fail(
                f"input {[n, ck, length]} does not hold blocks {list(self.block_shape)} at positions {nb}"
            )
        return Shape(inputs[0].type, (n, ck // kk, *self.image_shape))

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = args[0]
        k, nb = len(self.image_shape), self.blocks()
        acc = np.dtype(np.float32) if x.dtype in NARROW_FLOATS else x.dtype
        cols = x.astype(acc).reshape(out.lens[:2] + self.block_shape + tuple(nb))
        pad = [self.image_shape[i] + self.pads[i] + self.pads[i + k] for i in range(k)]
        image = np.zeros(out.lens[:2] + tuple(pad), acc)
        st, dil = self.strides, self.dilations
        for j in np.ndindex(*self.block_shape):
            # One kernel offset: its blocks land on distinct pixels, so a strided += is exact.
            win = tuple(
                slice(j[i] * dil[i], j[i] * dil[i] + st[i] * (nb[i] - 1) + 1, st[i]) for i in range(k)
            )
            image[(..., *win)] += cols[(slice(None), slice(None), *j)]
        crop = tuple(slice(self.pads[i], self.pads[i] + self.image_shape[i]) for i in range(k))
        return np.ascontiguousarray(image[(..., *crop)]).astype(out.dtype, copy=False)


@register_op
@op_class
class TensorScatter(Op):
    """ONNX TensorScatter: write ``update`` into a copy of ``past`` along ``axis`` from each batch's index.

    Batch ``b`` (dim 0) writes its ``update`` rows at ``write_indices[b] + s`` (mod the axis length when
    ``circular``); without ``write_indices`` every batch starts at 0. As in ORT, a negative index, or
    (linear) one whose write runs past the end, is an error.
    """

    name: ClassVar[str] = "tensor_scatter"
    axis: int = -2
    circular: bool = False

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        c = check_shapes(self.name, inputs).has(2, 3)
        check_shapes(self.name, inputs[:2]).same_type().same_ndims().min_ndims(2)
        past, upd = inputs[0], inputs[1]
        r = past.ndim()
        if not (-r <= self.axis < r and self.axis % r >= 1):
            raise c.fail(f"axis {self.axis} must name a non-batch dim of rank {r}")
        ax = self.axis % r
        off = [i for i in range(r) if i != ax]
        if [past.lens[i] for i in off] != [upd.lens[i] for i in off] or upd.lens[ax] > past.lens[ax]:
            raise c.fail(f"update {list(upd.lens)} does not fit cache {list(past.lens)} along axis {ax}")
        if len(inputs) == 3 and (inputs[2].type != DType.int64_type or inputs[2].lens != past.lens[:1]):
            raise c.fail(f"write_indices must be int64 of dims {list(past.lens[:1])}")
        return past.as_standard()

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        past, upd = args[0], args[1]
        ax = self.axis % past.ndim
        batch, m, s = past.shape[0], past.shape[ax], upd.shape[ax]
        w = args[2].astype(np.int64) if len(args) == 3 else np.zeros(batch, np.int64)
        if np.any(w < 0):
            raise IndexError(f"{self.name}: negative write index in {w.tolist()}")
        if not self.circular and np.any(w + s > m):
            raise IndexError(f"{self.name}: write indices {w.tolist()} + {s} rows run past length {m}")
        pos = w[:, None] + np.arange(s, dtype=np.int64)
        if self.circular and m:
            pos %= m
        present = np.array(past, copy=True, order="C")
        # Move the sequence axis next to the batch axis; the views write through to ``present``.
        np.moveaxis(present, ax, 1)[np.arange(batch)[:, None], pos] = np.moveaxis(upd, ax, 1)
        return present


@register_op
@op_class
class BitCast(Op):
    """ONNX BitCast: the same little-endian bytes read as ``target_type`` of the same width.

    Bool is excluded both ways: not every byte is a valid bool (and ORT's CPU EP has no such kernel).
    """

    name: ClassVar[str] = "bit_cast"
    target_type: DType = DType.float_type

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "target_type", DType(self.target_type))

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        bits = ALL_TYPES - {DType.bool_type}
        c = check_shapes(self.name, inputs).has(1).types(bits)
        out = inputs[0].as_standard().with_type(self.target_type)
        if self.target_type not in bits or out.type_size() != inputs[0].type_size():
            raise c.fail(f"cannot reinterpret as {self.target_type.name}: element sizes or bool")
        return out

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        return np.array(args[0], copy=True, order="C").view(out.dtype)

    def attributes(self) -> dict:
        return {"target_type": int(self.target_type)}
