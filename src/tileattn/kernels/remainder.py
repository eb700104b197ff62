"""The int8 code of the output's rounding remainder (a forward whose sinks
will be differentiated keeps it for the backward's rowsum(dO o O)): the
distance between the float32 output's bits and its 16-bit rounding's bits
(as float32), in steps of 2^(15 - mantissa bits) float32 units in the last
place - the bits of ``tileattn.sinks.encode_remainder`` /
``decode_remainder``.  Integer arithmetic on the bit patterns, a handful of
instructions a value (the Gluon forward encodes in its epilogue).  Pure
``@triton.jit`` code, no torch: the portable kernels and the Hopper forward
call the same functions.
"""
import triton
import triton.language as tl


@triton.jit
def encode_remainder(o, o16):
    """The int8 code of ``o`` (float32) beside ``o16`` (``o`` rounded to 16
    bits): (bits(o) - bits(float32(o16)) + 2^(s-1)) >> s, s = 15 - mantissa
    bits (8 for bf16, 5 for fp16), clamped to +-127
    (``tileattn.sinks.encode_remainder``, bit for bit)."""
    d = o.to(tl.int32, bitcast=True) - o16.to(tl.float32).to(tl.int32, bitcast=True)
    if o16.dtype.fp_mantissa_width > 14:   # no rounding (a float32 "o16": the interpreter's bf16 stand-in)
        code = d * 0
    else:
        SHIFT: tl.constexpr = 15 - o16.dtype.fp_mantissa_width
        code = (d + (1 << (SHIFT - 1))) >> SHIFT
    return tl.minimum(tl.maximum(code, -127), 127).to(tl.int8)


@triton.jit
def decode_remainder(hi, code, MANT: tl.constexpr):
    """float32 bits(``hi``) + ``code`` * 2^(15 - ``MANT``): a 16-bit output
    (``hi``, as float32, ``MANT`` mantissa bits) plus its remainder's int8
    ``code``."""
    if MANT > 14:   # a float32 hi (the interpreter's bf16 stand-in): nothing to add
        return hi
    SHIFT: tl.constexpr = 15 - MANT
    return (hi.to(tl.int32, bitcast=True) + (code.to(tl.int32) << SHIFT)).to(tl.float32, bitcast=True)
