"""turbospark.capture._f32display must print f32 values exactly as Rust's Display does.

The golden file was produced by tools/reference/f32_display.rs (real rustc);
the last test re-checks a fresh random sample against rustc when it is
available.
"""

from __future__ import annotations

import math
import random
import struct
from pathlib import Path

import pytest

import reference_harness
from turbospark.capture._f32display import format_f32, format_f32_row

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "f32_display_golden.txt"


def from_bits(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def load_golden() -> list[tuple[int, str]]:
    rows = []
    with GOLDEN.open(encoding="utf-8", newline="\n") as fh:
        for line in fh:
            if line.startswith("#"):
                continue
            hex_text, display = line.rstrip("\n").split("\t")
            rows.append((int(hex_text, 16), display))
    return rows


def test_golden_file_is_substantial():
    rows = load_golden()
    assert len(rows) >= 19000
    assert len({bits for bits, _ in rows}) == len(rows)


def test_every_golden_line():
    mismatches = []
    checked = 0
    for bits, expected in load_golden():
        value = from_bits(bits)
        if not math.isfinite(value):
            # Rust prints NaN / inf / -inf; we refuse and the row writes null.
            assert expected in ("NaN", "inf", "-inf"), (hex(bits), expected)
            with pytest.raises(ValueError):
                format_f32(value)
            continue
        checked += 1
        got = format_f32(value)
        if got != expected:
            mismatches.append(f"{bits:08X}: got {got!r}, rust {expected!r}")
    assert checked > 19000
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:10]}"


@pytest.mark.parametrize(
    "bits, expected",
    [
        (0x00000000, "0"),
        (0x80000000, "-0"),
        (0x3F800000, "1"),
        (0x40400000, "3"),
        (0xC0400000, "-3"),
        (0x3FC00000, "1.5"),
        (0x3DCCCCCD, "0.1"),
        (0x33D6BF95, "0.0000001"),  # 1e-7f32: positional, never 1e-7
        (0x60AD78EC, "100000000000000000000"),  # 1e20f32
        (0x00000001, "0.000000000000000000000000000000000000000000001"),  # min subnormal
        (0x007FFFFF, "0.000000000000000000000000000000000000011754942"),  # max subnormal
        (0x00800000, "0.000000000000000000000000000000000000011754944"),  # f32::MIN_POSITIVE
        (0x7F7FFFFF, "340282350000000000000000000000000000000"),  # f32::MAX
        (0xFF7FFFFF, "-340282350000000000000000000000000000000"),  # f32::MIN
        (0x34000000, "0.00000011920929"),  # f32::EPSILON
        (0x4B800001, "16777218"),
        # Exact ties between two equally short candidates round UP in
        # magnitude (numpy rounds these to the even digit instead):
        (0x4A7FFFF9, "4194302.3"),  # exactly 4194302.25
        (0xCA459A1D, "-3237511.3"),  # exactly -3237511.25
        (0x46F53A20, "31389.063"),  # exactly 31389.0625
        (0x488D2994, "289100.63"),  # exactly 289100.625
        (0x4A7FFFFB, "4194302.8"),  # exactly 4194302.75: up is also even
        (0xBECD0000, "-0.40039063"),  # exactly -0.400390625
        (0x41E39000, "28.445313"),  # exactly 28.4453125
    ],
)
def test_named_cases(bits, expected):
    assert format_f32(from_bits(bits)) == expected


def test_plain_python_floats_rounded_to_f32():
    assert format_f32(f32(0.1)) == "0.1"
    assert format_f32(f32(-2.5)) == "-2.5"
    assert format_f32(f32(1e-7)) == "0.0000001"
    assert format_f32(f32(1e20)) == "100000000000000000000"
    assert format_f32(f32(123456789.0)) == "123456790"


def test_rejects_non_finite_and_non_f32():
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError):
            format_f32(bad)
    with pytest.raises(ValueError):
        format_f32(0.1)  # not exactly an f32; callers must round first
    with pytest.raises(ValueError):
        format_f32(1e300)


def test_row_matches_reference_layout():
    # The reference's own unit test row.
    assert format_f32_row([3.5, 2.5, 1.5]) == "[3.5,2.5,1.5]"
    assert format_f32_row([]) == "[]"
    assert format_f32_row([f32(0.1)]) == "[0.1]"


def test_row_writes_non_finite_as_null():
    row = [f32(-1.25), math.nan, 0.0, math.inf, -0.0, -math.inf, f32(1e-7), 3.0]
    assert format_f32_row(row) == "[-1.25,null,0,null,-0,null,0.0000001,3]"


def test_row_accepts_numpy_float32():
    import numpy as np
    row = np.array([0.1, -19.87654321, np.nan, 4194302.25], dtype=np.float32)
    assert format_f32_row(row) == "[0.1,-19.876543,null,4194302.3]"
    assert format_f32_row(row.tolist()) == "[0.1,-19.876543,null,4194302.3]"


def test_fresh_random_sample_against_rustc(reference_tools):
    rng = random.Random()  # fresh every run; the seed is reported on failure
    seed = rng.randrange(2**32)
    rng.seed(seed)
    bits_list = [rng.getrandbits(32) for _ in range(20000)]
    # Also bias a quarter of the sample towards binades where ties live.
    bits_list += [(rng.choice((0, 1)) << 31) | (rng.randrange(0x43000000, 0x4B000000)) for _ in range(5000)]
    expected = reference_harness.rust_display(bits_list, reference_tools)
    mismatches = []
    for bits, want in zip(bits_list, expected):
        value = from_bits(bits)
        if not math.isfinite(value):
            assert want in ("NaN", "inf", "-inf")
            continue
        got = format_f32(value)
        if got != want:
            mismatches.append(f"{bits:08X}: got {got!r}, rust {want!r}")
    assert not mismatches, f"seed {seed}: {len(mismatches)} mismatches, first: {mismatches[:10]}"
