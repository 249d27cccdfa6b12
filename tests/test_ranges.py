"""gradcache.ranges: the one range checker of the library, the models and the program, against the rule written
out case by case (an int is never a bool; a finite number is a real that is not NaN or infinite)."""
import math
from fractions import Fraction

import pytest

try:  # the library's tests also run on the torch floor, where numpy is not installed
    import numpy as np
except ImportError:
    np = None

from gradcache.ranges import bounds, check_finite, check_int, is_finite, is_int, within

VALUES = [-2, -1, 0, 1, 2, 3, True, False, 1.0, 2.5, "2", None, float("nan"), float("inf"), -math.inf, Fraction(1, 2)]
NUMPY_TYPES = () if np is None else (np.int64, np.float32)
VALUES += [] if np is None else [np.int64(2), np.float32(0.5)]


@pytest.mark.parametrize("value", VALUES, ids=repr)
@pytest.mark.parametrize("at_least, at_most", [(None, None), (0, None), (1, None), (2, None), (1, 2), (None, 0)])
def test_is_int_is_an_int_not_a_bool_within_the_bounds(value, at_least, at_most):
    whole = type(value) is int  # np.int64 is no int subclass; bool is, and is refused
    expected = whole and (at_least is None or value >= at_least) and (at_most is None or value <= at_most)
    assert is_int(value, at_least, at_most) == expected


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_is_finite_is_a_real_number_not_a_bool_nor_nan_nor_infinite(value):
    real = type(value) in (int, float, Fraction, *NUMPY_TYPES)
    assert is_finite(value) == (real and math.isfinite(float(value)))


@pytest.mark.parametrize("value", [-1.0, 0.0, 0.5, 1.0, 2.0])
def test_within_each_bound(value):
    assert within(value) is True
    assert within(value, at_least=0.0) == (value >= 0.0) and within(value, above=0.0) == (value > 0.0)
    assert within(value, at_most=1.0) == (value <= 1.0) and within(value, below=1.0) == (value < 1.0)
    assert within(value, at_least=0.0, below=1.0) == (0.0 <= value < 1.0)


def test_bounds_in_words():
    assert bounds(at_least=1) == ">= 1" and bounds(above=0) == "> 0" and bounds() == ""
    assert bounds(at_least=1, at_most=8) == "from 1 to 8" and bounds(at_least=0, below=1) == ">= 0 and < 1"


def test_check_int_returns_the_value_or_names_the_argument_its_range_and_the_value():
    assert check_int(3, "chunk_size") == 3 and check_int(0, "queue_size", at_least=0) == 0
    assert check_int(None, "tile_size", optional="dense") is None
    with pytest.raises(ValueError, match=r"^chunk_size must be an int >= 1, got 0$"):
        check_int(0, "chunk_size")
    with pytest.raises(ValueError, match=r"^chunk_size must be an int >= 1, got True of type bool$"):
        check_int(True, "chunk_size")
    with pytest.raises(ValueError, match=r"^chunk_size must be an int >= 1, got None of type NoneType$"):
        check_int(None, "chunk_size")
    with pytest.raises(ValueError, match=r"^tile_size must be None \(dense\) or an int >= 1 \(rows per tile\), "
                                         r"got '4' of type str$"):
        check_int("4", "tile_size", optional="dense", meaning="rows per tile")
    with pytest.raises(ValueError, match=r"^dim must be an int from 1 to 8, got 9$"):
        check_int(9, "dim", at_most=8)


def test_check_finite_returns_a_float_or_names_the_argument_its_range_and_the_value():
    assert check_finite(1, "margin") == 1.0 and isinstance(check_finite(1, "margin"), float)
    assert check_finite(0.5, "share", at_least=0, at_most=1) == 0.5
    for value in (float("nan"), math.inf, True, "1"):
        with pytest.raises(ValueError, match=r"^margin must be a finite number, got "):
            check_finite(value, "margin")
    with pytest.raises(ValueError, match=r"^temperature must be a finite number > 0 \(it divides\), got 0$"):
        check_finite(0, "temperature", above=0, meaning="it divides")
