"""The int8 code of the output's rounding remainder (a forward whose sinks
will be differentiated keeps it for the backward's rowsum(dO o O)): units of
ulp(out) / 256, the bits of ``tileattn.sinks.encode_remainder`` /
``decode_remainder``.  Pure ``@triton.jit`` code, no torch: the portable
kernels and the Hopper forward (Gluon) call the same functions.
"""
import triton
import triton.language as tl


@triton.jit
def encode_remainder(o, o16):
    """The int8 code of the rounding remainder ``o - o16`` (``o`` float32,
    ``o16`` it rounded to 16 bits): units of ulp(o16) / 256, rounded to
    nearest, clamped to +-127; 0 where that unit is not a normal float32
    (``tileattn.sinks.encode_remainder``, bit for bit)."""
    MANT: tl.constexpr = o16.dtype.fp_mantissa_width
    hi = o16.to(tl.float32)
    e_unit = ((hi.to(tl.int32, bitcast=True) >> 23) & 0xFF) - (MANT + 8)
    ok = e_unit >= 1
    inv_unit = tl.where(ok, (254 - e_unit) << 23, 127 << 23).to(tl.float32, bitcast=True)
    x = tl.minimum(tl.maximum((o - hi) * inv_unit, -127.0), 127.0)
    x = (x + 12582912.0) - 12582912.0   # to the nearest integer, ties to even
    return tl.where(ok, x, 0.0).to(tl.int8)


@triton.jit
def decode_remainder(hi, code, MANT: tl.constexpr):
    """float32 ``hi + code * ulp(hi) / 256``: a 16-bit output (``hi``, as
    float32, ``MANT`` mantissa bits) plus its remainder's int8 ``code``."""
    e_unit = ((hi.to(tl.int32, bitcast=True) >> 23) & 0xFF) - (MANT + 8)
    unit = tl.where(e_unit >= 1, e_unit << 23, 0).to(tl.float32, bitcast=True)
    return hi + code.to(tl.float32) * unit
