"""Transposing pointwise kernels: one input contiguous along a dim other than the output's innermost
is read and written in 32x32 tiles staged through shared memory, so loads and stores both coalesce."""

from __future__ import annotations

from .params import Params
from .prelude import BLOCK, decompose, offset

_TILE = 32


def transposed_dim(lens: list[int], strides: list[list[int]]) -> int | None:
    """For one input that is contiguous along a dim other than the output's innermost (a transpose),
    that dim; the tiled path then reads and writes 32x32 tiles, both coalesced."""
    if len(strides) != 2 or len(lens) < 2 or strides[0][-1] != 1 or strides[1][-1] == 1:
        return None
    ones = [d for d in range(len(lens) - 1) if strides[1][d] == 1]
    if not ones or lens[ones[0]] < _TILE // 2 or lens[-1] < _TILE // 2:
        return None
    return ones[0]


def n_tiles(lens: list[int], a: int) -> int:
    n = -(-lens[a] // _TILE) * -(-lens[-1] // _TILE)
    for d in range(len(lens) - 1):
        n *= lens[d] if d != a else 1
    return n


def tiled_body(idx: str, lens: list[int], strides: list[list[int]], a: int, in_c: str, p: Params) -> str:
    """Tiles over (dim ``a``, the last dim) staged through shared memory; other dims index the tiles.
    Sizes and strides (other than 0 and 1) are run-time arguments (``p``)."""
    k = len(lens) - 1
    outer = [d for d in range(k) if d != a]
    tile_lens = [p(x) for x in [lens[d] for d in outer] + [-(-lens[a] // _TILE), -(-lens[k] // _TILE)]]
    digits = [f"d{d}" for d in outer] + ["qa", "qk"]
    so, si = ([p.stride(x) for x in st] for st in strides)
    sik, soa = (x if isinstance(x, str) else f"{x}u" for x in (si[k], so[a]))
    ld = f"in0[bi + ia + ik * {sik}]"
    st = f"out0[bo + ia * {soa} + ik]"
    inside = f"ia < {p(lens[a])} && ik < {p(lens[k])}"
    lines = [
        f"  __shared__ {in_c} tile[{_TILE}][{_TILE + 1}];",
        "  const u32 tx = threadIdx.x % 32u, ty = threadIdx.x / 32u;",
        f"  for ({idx} t = blockIdx.x; t < {p(n_tiles(lens, a))}; t += gridDim.x) {{",
        *[f"    {x}" for x in decompose("t", tile_lens, "g", idx)],
        *[f"    const {idx} {dg} = g{i};" for i, dg in enumerate(digits)],
        f"    const {idx} bi = {offset([f'd{d}' for d in outer], [si[d] for d in outer], idx)};",
        f"    const {idx} bo = {offset([f'd{d}' for d in outer], [so[d] for d in outer], idx)};",
        f"    for (u32 j = ty; j < {_TILE}u; j += {BLOCK // 32}u) {{  // read along the input's fast dim",
        f"      const {idx} ia = qa * {_TILE}u + tx, ik = qk * {_TILE}u + j;",
        f"      if ({inside}) tile[j][tx] = {ld};",
        "    }",
        "    __syncthreads();",
        f"    for (u32 j = ty; j < {_TILE}u; j += {BLOCK // 32}u) {{  // write along the output's",
        f"      const {idx} ia = qa * {_TILE}u + j, ik = qk * {_TILE}u + tx;",
        f"      if ({inside}) {st} = mx_elem(mx_ld(tile[tx][j]));",
        "    }",
        "    __syncthreads();",
        "  }",
    ]
    return "\n".join(lines) + "\n"
