"""Range checks of numeric arguments, written once for the library, the models and the training program: whether a
value is a whole number (an int, never a bool: True is not a count) or a finite real number within bounds
(`is_int`, `is_finite`, `within`), and the checks that raise naming the argument, its range and the value
(`check_int`, `check_finite`). A caller whose message says more (a folder and its key, the fix) asks the predicate
and raises its own."""
from __future__ import annotations

import math
from numbers import Real

__all__ = ["bounds", "check_finite", "check_int", "is_finite", "is_int", "within"]


def within(value: float, *, at_least: float | None = None, above: float | None = None,
           at_most: float | None = None, below: float | None = None) -> bool:
    """at_least <= value, above < value, value <= at_most, value < below: each bound given."""
    return ((at_least is None or value >= at_least) and (above is None or value > above)
            and (at_most is None or value <= at_most) and (below is None or value < below))


def is_int(value: object, at_least: int | None = None, at_most: int | None = None) -> bool:
    """Whether `value` is an int (not a bool) with at_least <= value <= at_most (each bound given)."""
    return isinstance(value, int) and not isinstance(value, bool) and within(value, at_least=at_least,
                                                                             at_most=at_most)


def is_finite(value: object) -> bool:
    """Whether `value` is a real number (not a bool) that is neither NaN nor infinite."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(float(value))


def bounds(at_least: float | None = None, above: float | None = None, at_most: float | None = None,
           below: float | None = None) -> str:
    """The bounds in words: '>= 1', '> 0', 'from 1 to 65536', '>= 0 and < 1'; '' for none."""
    if at_least is not None and at_most is not None:
        return f"from {at_least} to {at_most}"
    low = f">= {at_least}" if at_least is not None else f"> {above}" if above is not None else ""
    high = f"<= {at_most}" if at_most is not None else f"< {below}" if below is not None else ""
    return " and ".join(part for part in (low, high) if part)


def check_int(value: object, name: str, *, at_least: int | None = 1, at_most: int | None = None,
              optional: str | None = None, meaning: str = "") -> int | None:
    """`value` if it is an int within [at_least, at_most] (or None, where `optional` says what None means).

    Raises:
        ValueError: '{name} must be [None ({optional}) or ]an int >= 1[ ({meaning})], got {value!r}'.
    """
    if value is None and optional is not None:
        return None
    if not is_int(value, at_least, at_most):
        expected = f"an int {bounds(at_least=at_least, at_most=at_most)}".rstrip()
        expected += f" ({meaning})" if meaning else ""
        expected = f"None ({optional}) or {expected}" if optional is not None else expected
        of_type = "" if isinstance(value, int) and not isinstance(value, bool) else f" of type {type(value).__name__}"
        raise ValueError(f"{name} must be {expected}, got {value!r}{of_type}")
    return value


def check_finite(value: object, name: str, *, at_least: float | None = None, above: float | None = None,
                 at_most: float | None = None, below: float | None = None, meaning: str = "") -> float:
    """`value` as a float if it is a finite real number within the bounds given.

    Raises:
        ValueError: '{name} must be a finite number[ {bounds}][ ({meaning})], got {value!r}'.
    """
    limits = dict(at_least=at_least, above=above, at_most=at_most, below=below)
    if not is_finite(value) or not within(float(value), **limits):
        expected = f"a finite number {bounds(**limits)}".rstrip() + (f" ({meaning})" if meaning else "")
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return float(value)
