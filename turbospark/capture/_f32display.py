"""Rust-exact ``Display`` formatting of f32 values, in pure Python.

Why this exists: the reference recorder (``router_hist.rs``) writes the
captured router-logit row with ``f32::to_string()``, and turbospark's JSON
must be byte-identical to it. Rust prints the *shortest* decimal digit string
that round-trips to the same ``f32``, always in positional notation (no
exponent), and no Python or numpy formatter reproduces that exactly:

* ``repr(float)`` is shortest for f64, not f32 (``0.1f32`` would print as
  ``0.10000000149011612``);
* ``numpy.format_float_positional(np.float32(x), unique=True)`` breaks an
  exact tie between two equally short, equally close candidates toward the
  even digit, whereas Rust rounds the magnitude up: bits ``0x4A7FFFF9`` are
  exactly 4194302.25, and Rust prints ``4194302.3`` where numpy prints
  ``4194302.2``. About 0.2% of random f32 bit patterns are such ties, mostly
  between 2**8 and 2**22 but also short dyadic values in the router-logit
  range (``-0.400390625``: Rust ``-0.40039063``, numpy ``-0.40039062``).
  numpy also writes ``3.`` / ``-0.`` unless told to trim.

So this module re-implements ``core::num::flt2dec`` for f32 with exact
Python integer arithmetic:

* ``decode`` as Rust does it: value ``v = mant * 2**exp`` with round-trip
  interval ``[v - minus*2**exp, v + plus*2**exp]``; the interval is
  asymmetric (``minus`` half of ``plus``) whenever the 24-bit mantissa is the
  minimum normal mantissa ``0x800000`` (every power of two, including
  ``f32::MIN_POSITIVE``), and its ends are *inclusive* when Rust's decoded
  mantissa is even (always the case for subnormals, whose mantissa Rust
  stores shifted left by one);
* ``strategy::dragon::format_shortest``: generate digits until the truncated
  value (``down``) or the truncated value plus one unit in the last digit
  (``up``) lies inside that interval, then round up iff ``up`` holds and
  either ``down`` does not or the remainder is at least half a unit
  (``2*rem >= scale``), i.e. exact ties round UP, never to even. (Rust tries
  Grisu first and falls back to Dragon when Grisu cannot decide; the answers
  are the same, which the sweeps against rustc behind tests/ confirm.)
* ``digits_to_dec_str`` with ``frac_digits = 0``: positional notation, no
  trailing ``.0``; ``-0.0`` prints ``-0``.

Non-finite values are the caller's business: ``format_f32`` raises
``ValueError`` (Rust would print ``NaN`` / ``inf``), and ``format_f32_row``
writes them as JSON ``null``, turbospark's one deliberate divergence from the
reference, whose output would not be valid JSON there.

Values must already be exactly representable as f32 (round them first, e.g.
``struct.unpack('<f', struct.pack('<f', x))[0]``); anything else raises
``ValueError`` rather than printing digits for a value Rust never saw.
"""

from __future__ import annotations

import math
import struct
from typing import Iterable, Optional

__all__ = ["format_f32", "format_f32_row", "logits_member"]

_PACK_F = struct.Struct("<f").pack
_UNPACK_I = struct.Struct("<I").unpack
_UNPACK_F = struct.Struct("<f").unpack

_MIN_NORMAL_MANT = 0x800000
# Fixed tables, never grown at run time. Decimal exponents of the scaled
# interval ends stay within about 10**-46 .. 10**39 for f32.
_POW10 = tuple(10**i for i in range(64))
_LOG10_2 = math.log10(2.0)


def _f32_bits(value: float) -> int:
    try:
        packed = _PACK_F(value)
    except OverflowError:
        # struct refuses finite doubles beyond f32 range: not an f32 value.
        raise ValueError(f"{value!r} is not representable as an f32") from None
    bits: int = _UNPACK_I(packed)[0]
    if _UNPACK_F(packed)[0] != value and value == value:
        raise ValueError(f"{value!r} is not exactly representable as an f32")
    return bits


def _shortest_digits(bits: int) -> tuple[str, int]:
    """Dragon ``format_shortest`` for a positive finite nonzero f32.

    Returns ``(digits, k)`` meaning ``0.digits * 10**k``, exactly as Rust's
    ``format_shortest`` returns ``(buf, exp)``.
    """
    biased = (bits >> 23) & 0xFF
    frac = bits & 0x7FFFFF
    # f32::integer_decode
    if biased == 0:
        mant = frac << 1
    else:
        mant = frac | _MIN_NORMAL_MANT
    exp = biased - 150
    # flt2dec::decoder::decode
    inclusive = (mant & 1) == 0
    if biased == 0:
        # Subnormal: neighbours are mant -/+ 2 at the same exponent, because
        # integer_decode already shifted the mantissa left by one.
        minus = plus = 1
    elif mant == _MIN_NORMAL_MANT:
        # Lower neighbour is half as far away (also applied, slightly too
        # conservatively, to f32::MIN_POSITIVE, as Rust does).
        mant, minus, plus, exp = mant << 2, 1, 2, exp - 2
    else:
        mant, minus, plus, exp = mant << 1, 1, 1, exp - 1

    # Exact fractions over a common denominator `den`:
    #   v = mant/den, low = (mant - minus)/den, high = (mant + plus)/den.
    if exp >= 0:
        mant <<= exp
        minus <<= exp
        plus <<= exp
        den = 1
    else:
        den = 1 << -exp
    high = mant + plus

    # k with 10**(k-1) <= high < 10**k (inclusive interval) or
    # 10**(k-1) < high <= 10**k (exclusive): where Rust's
    # estimate_scaling_factor plus its one-step fixup land.
    k = math.ceil((high.bit_length() - den.bit_length()) * _LOG10_2)
    while True:
        if k >= 0:
            ten_k, high_k = den * _POW10[k], high
        else:
            ten_k, high_k = den, high * _POW10[-k]
        if ten_k < high_k or (inclusive and ten_k == high_k):
            k += 1  # 10**k is inside the interval's high end: too small
        elif ten_k > 10 * high_k or (not inclusive and ten_k == 10 * high_k):
            k -= 1  # 10**(k-1) is past the high end already: too large
        else:
            break

    # Digit count n means the grid 10**(k-n). Dragon stops at the smallest n
    # where the truncated value (`down`) or it plus one grid unit (`up`) lies
    # inside the interval, and once a grid has such a candidate every finer
    # grid does too. Nine digits always suffice for f32, so divide once on
    # the 9-digit grid and read every coarser grid's quotient and remainder
    # off it, walking n down from 9 until the stop condition first fails.
    p = k - 9
    if p >= 0:
        unit = den * _POW10[p]
    else:
        scale10 = _POW10[-p]
        unit = den
        mant *= scale10
        minus *= scale10
        plus *= scale10
    q9, rem = divmod(mant, unit)
    if inclusive:
        down, up = rem <= minus, unit - rem <= plus
    else:
        down, up = rem < minus, unit - rem < plus
    if not (down or up):  # pragma: no cover - impossible for f32
        raise AssertionError(f"no 9-digit candidate for f32 bits {bits:#010x}")
    n, best = 9, (rem, unit, down, up)
    while n > 1:
        t = _POW10[10 - n]
        rem_n = (q9 % t) * unit + rem
        unit_n = unit * t
        if inclusive:
            down, up = rem_n <= minus, unit_n - rem_n <= plus
        else:
            down, up = rem_n < minus, unit_n - rem_n < plus
        if not (down or up):
            break
        n -= 1
        best = (rem_n, unit_n, down, up)
    rem, unit, down, up = best
    q = q9 // _POW10[9 - n]
    # Round up iff `up` and (not `down`, or the remainder is at least half a
    # unit): exact ties go UP, not to even.
    if up and (not down or 2 * rem >= unit):
        q += 1
    digits = str(q)
    # q has exactly n digits, except Dragon's leading-zero first digit
    # ("0" rounded up to "1", same length) and a 99..9 carry (one longer,
    # with Rust bumping k, so the value stays q * 10**(k-n)).
    if len(digits) > n:
        k += len(digits) - n
    return digits, k


def _dec_str(digits: str, exp: int) -> str:
    """``flt2dec::digits_to_dec_str`` with ``frac_digits == 0``."""
    if exp <= 0:
        return "0." + "0" * (-exp) + digits
    if exp < len(digits):
        return digits[:exp] + "." + digits[exp:]
    return digits + "0" * (exp - len(digits))


def format_f32(value: float) -> str:
    """Exactly what Rust's ``format!("{}", v)`` prints for the f32 ``value``.

    ``value`` must be finite and exactly representable as an f32; ``ValueError``
    otherwise (non-finite values: the caller writes ``null``).

    >>> format_f32(3.0), format_f32(-0.0), format_f32(1.5)
    ('3', '-0', '1.5')
    """
    if value != value or value in (math.inf, -math.inf):
        raise ValueError(f"non-finite f32 {value!r} has no JSON number form")
    bits = _f32_bits(value)
    sign = "-" if bits >> 31 else ""
    if bits & 0x7FFFFFFF == 0:
        return sign + "0"
    digits, exp = _shortest_digits(bits & 0x7FFFFFFF)
    return sign + _dec_str(digits, exp)


def format_f32_row(values: Iterable[float]) -> str:
    """``[a,b,c]`` of ``format_f32`` items; NaN and +/-inf are written ``null``.

    Matches the reference's ``router_logits.values`` array byte for byte for
    finite rows; ``null`` for non-finite entries is deliberate (Rust would
    emit ``NaN`` / ``inf``, which is not JSON).
    """
    parts: list[str] = []
    append = parts.append
    for value in values:
        value = float(value)
        if value != value or value in (math.inf, -math.inf):
            append("null")
        else:
            append(format_f32(value))
    return "[" + ",".join(parts) + "]"


def logits_member(layer: int, pass_: int, values: Optional[Iterable[float]]) -> str:
    """``,"router_logits":{"layer":L,"pass":P,"values":[...]}``, as every capture writer emits it
    (the recorder, merge, ``export --to json``); ``values`` None (the pass never came) is ``null``."""
    row = "null" if values is None else format_f32_row(values)
    return f',"router_logits":{{"layer":{layer},"pass":{pass_},"values":{row}}}'
