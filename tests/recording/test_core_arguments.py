"""Each recorder core checks its own constructor arguments, whatever calls it (not only the facade)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from turbospark.recording import _recorder_py

from conftest import compiled_core


@pytest.fixture(params=["compiled", "python"])
def core(request: pytest.FixtureRequest) -> Any:
    if request.param == "python":
        return _recorder_py.RecorderCore
    found = compiled_core()
    if found is None:
        pytest.skip("the compiled core is not built")
    return found


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((2, 2**63, 0, False, None, -1, 0), ValueError, "num_experts must be at most 4294967296, got 9223372036854775808"),
        ((2, 0, 0, False, None, -1, 0), ValueError, "num_experts must be at least 1, got 0"),
        ((-1, 4, 0, False, None, -1, 0), ValueError, "num_layers must be at least 0, got -1"),
        ((2**40, 4, 0, False, None, -1, 0), ValueError, "num_layers must be at most 2147483647, got 1099511627776"),
        ((2, 4, -3, False, None, -1, 0), ValueError, "top_k must be at least 0, got -3"),
        ((2, 4, 0, False, "later", -1, 0), ValueError, "pilot must be None, 'next' or 'self', got 'later'"),
        ((2, 4, 0, False, None, 2, 0), ValueError, "router_logits layer must be at most 1, got 2"),
        ((2, 4, 0, False, None, -2, 0), ValueError, "router_logits layer must be at least -1, got -2"),
        ((2, 4, 0, False, None, 0, 2**64), ValueError, "router_logits pass must be at most 18446744073709551615, got 18446744073709551616"),
        ((2, 4.0, 0, False, None, -1, 0), TypeError, "num_experts must be an integer, got float 4.0"),
        ((2, 4, True, False, None, -1, 0), TypeError, "top_k must be an integer, got bool True"),
    ],
)
def test_bad_arguments_are_refused(core: Any, args: tuple[Any, ...], error: type, message: str) -> None:
    with pytest.raises(error) as info:
        core(*args)
    assert str(info.value) == message


def test_a_count_matrix_beyond_the_address_space_is_refused(core: Any) -> None:
    # 2**31 - 1 layers x 2**32 experts: the product overflows a 64-bit
    # byte count, so it must be refused before any arithmetic on it.
    with pytest.raises(MemoryError) as info:
        core(2**31 - 1, 2**32, 0, False, None, -1, 0)
    assert str(info.value) == (
        "a count matrix of 2147483647 layers x 4294967296 experts does not fit in this process's address space"
    )
    assert sys.maxsize // 8 < (2**31 - 1) * 2**32


def test_good_arguments_make_a_working_core(core: Any) -> None:
    made = core(2, 5, 0, True, "next", 1, 3)
    made.record(0, [4, 0])
    assert (made.num_layers, made.num_experts, made.top_k) == (2, 5, 2)
