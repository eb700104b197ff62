"""The int8 code of the output's rounding remainder (a forward whose sinks
will be differentiated keeps it for the backward's rowsum(dO o O)): the
distance between the float32 output's bits and its 16-bit rounding's bits
(as float32), in steps of 2^(15 - mantissa bits) float32 units in the last
place - the bits of ``tileattn.sinks.encode_remainder`` /
``decode_remainder`` (whose comment gives the format).  Integer arithmetic
on the bit patterns: for bf16 two instructions a value (the Gluon forward
encodes in its epilogue).  Pure ``@triton.jit`` code, no torch: the
portable kernels and the Hopper forward call the same functions.
"""
import triton
import triton.language as tl


@triton.jit
def encode_remainder(o, o16):
    """The int8 code of ``o`` (float32) beside ``o16`` (``o`` rounded to 16
    bits to nearest); s = 15 - mantissa bits: for bf16 byte 1 of
    bits(o) + 2^7 (o16 does not enter), for fp16
    (bits(o) - bits(float32(o16)) + 2^(s-1)) >> s clamped to +-127
    (``tileattn.sinks.encode_remainder``, bit for bit)."""
    bits = o.to(tl.int32, bitcast=True)
    if o16.dtype.fp_mantissa_width > 14:   # no rounding (a float32 "o16": the interpreter's bf16 stand-in)
        code = bits * 0
    elif o16.dtype.fp_mantissa_width == 7:   # bf16 drops bits(o)'s low 16 bits: the low byte is the code mod 256
        code = (bits + 128) >> 8
    else:
        SHIFT: tl.constexpr = 15 - o16.dtype.fp_mantissa_width
        code = (bits - o16.to(tl.float32).to(tl.int32, bitcast=True) + (1 << (SHIFT - 1))) >> SHIFT
        code = tl.minimum(tl.maximum(code, -127), 127)
    return code.to(tl.int8)


@triton.jit
def decode_remainder(hi, code, MANT: tl.constexpr):
    """float32 bits(``hi``) + ``code`` * 2^(15 - ``MANT``), code -128 as 0:
    a 16-bit output (``hi``, as float32, ``MANT`` mantissa bits) plus its
    remainder's int8 ``code``."""
    if MANT > 14:   # a float32 hi (the interpreter's bf16 stand-in): nothing to add
        return hi
    SHIFT: tl.constexpr = 15 - MANT
    c = code.to(tl.int32)
    c = tl.where(c == -128, 0, c)
    return (hi.to(tl.int32, bitcast=True) + (c << SHIFT)).to(tl.float32, bitcast=True)
