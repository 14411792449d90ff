"""canonical(): a kernel's own name becomes the one symbol every kernel compiles under, whole words only
(as a regex word-boundary substitution would), without a regex pass over each source."""

from __future__ import annotations

import re

import pytest

from migraphx_ep.targets.gpu.kernels.spec import KERNEL_SYMBOL, KernelSpec, canonical, replace_word


@pytest.mark.parametrize(
    "text",
    [
        "k1_add",
        "void k1_add(int k1_addx, int xk1_add, int _k1_add) { k1_add; } k1_add",
        "k1_add2 k1_add_ k1_add.k1_add(k1_add)",
        "nothing here",
        "",
        "k1_addk1_add k1_add k1_add",
    ],
)
def test_replace_word_is_a_word_boundary_substitution(text: str) -> None:
    assert replace_word(text, "k1_add", "mx_kernel") == re.sub(r"\bk1_add\b", "mx_kernel", text)


def test_canonical_renames_the_symbol_and_keeps_the_rest() -> None:
    src = 'extern "C" __global__ void k7_mul(float* a) { /* k7_mul */ k7_mulx(a); }'
    spec = canonical(KernelSpec("k7_mul", src, (1, 1, 1), (32, 1, 1)))
    assert spec.name == KERNEL_SYMBOL
    assert (
        spec.source
        == f'extern "C" __global__ void {KERNEL_SYMBOL}(float* a) {{ /* {KERNEL_SYMBOL} */ k7_mulx(a); }}'
    )
    assert canonical(spec) is spec
