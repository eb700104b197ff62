"""exp2 off the special-function unit (Gluon): for the Hopper forward's
softmax, where at d = 64 the MUFU's 16 exp2 a clock per SM take as long as
the tile's products (a 128 x 128 tile: 1,024 clocks of exp2 against 1,024
of tensor-core work), so part of each tile goes to the FMA pipe instead.

2^x = 2^j 2^f with j = round(x), f = x - j in [-1/2, 1/2]: j comes from the
float adder (adding 1.5 * 2^23 leaves round(x) in the low mantissa bits;
no float-to-int conversion, which is as slow as the MUFU), 2^f is the cubic
1 + f (C1 + f (C2 + f C3)) fitted for least maximum relative error on
[-1/2, 1/2] (1.01e-4, against the 2^-9 / 2^-11 rounding of a bf16 / fp16 P),
and j goes into the exponent bits with an integer add.  Only for finite
x <= 0 (an unmasked tile's scaled scores less the row max); below -126 it
returns ~1e-38 instead of 0, which no sum notices.

This module imports Gluon at load time: only the Hopper kernels import it.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

EXP2_C1: gl.constexpr = gl.constexpr(0.6932829170291436)
EXP2_C2: gl.constexpr = gl.constexpr(0.24221063136985826)
EXP2_C3: gl.constexpr = gl.constexpr(0.05500868998260753)
ROUND_SHIFT: gl.constexpr = gl.constexpr(12582912.0)   # 1.5 * 2^23


@gluon.jit
def exp2_fma(x):
    """2^x for finite x <= 0 on the FMA pipe (see the module docstring)."""
    x = gl.maximum(x, -126.0)
    t = x + ROUND_SHIFT
    j = t - ROUND_SHIFT
    f = x - j
    p = gl.fma(gl.fma(gl.fma(f, EXP2_C3, EXP2_C2), f, EXP2_C1), f, 1.0)
    # t's bits are those of 1.5 * 2^23 plus j: shifted by 23, only j << 23 is left
    bits = p.to(gl.int32, bitcast=True) + (t.to(gl.int32, bitcast=True) << 23)
    return bits.to(gl.float32, bitcast=True)


@gluon.jit
def exp2_split(x, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, FMA_EXP: gl.constexpr, layout: gl.constexpr):
    """exp2 of an MMA-accumulator tile (``layout``), 1/``FMA_EXP`` of its
    elements by :func:`exp2_fma` and the rest by the MUFU.  The split follows
    the accumulator's registers: each thread holds adjacent column pairs of
    every 8-column group, so the pair's second column (FMA_EXP = 2) or the
    second column of every other group's pair (4) is a size-2 axis a
    reshape, permute and split take apart without moving data."""
    if FMA_EXP == 2:
        a, b = gl.split(gl.reshape(x, [BLOCK_M, BLOCK_N // 2, 2]))
        p = gl.reshape(gl.join(gl.exp2(a), exp2_fma(b)), [BLOCK_M, BLOCK_N])
    else:
        gl.static_assert(FMA_EXP == 4, "FMA_EXP: 2 or 4")
        # column = 16 kh + 8 kl + 2 t + e: kl last, then e
        y = gl.permute(gl.reshape(x, [BLOCK_M, BLOCK_N // 16, 2, 4, 2]), [0, 1, 3, 4, 2])
        a, b = gl.split(y)
        b0, b1 = gl.split(b)
        y = gl.join(gl.exp2(a), gl.join(gl.exp2(b0), exp2_fma(b1)))
        p = gl.reshape(gl.permute(y, [0, 1, 4, 2, 3]), [BLOCK_M, BLOCK_N])
    return gl.convert_layout(p, layout)
