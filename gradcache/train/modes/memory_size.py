"""`--memory-budget`'s values: a size in bytes with an optional K, M or G suffix (text's option, modes/text.py)."""
from __future__ import annotations

import argparse
import math

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def memory_bytes(text: str) -> int:
    """`--memory-budget`: bytes, as a finite number >= 0 with an optional K, M or G suffix (powers of 1024): 2G, 500M.

    Raises:
        argparse.ArgumentTypeError: an empty value, not a number, NaN, infinite (`inf`, `1e400`) or negative: the
            parser exits 2 naming the option.
    """
    stripped = text.strip()
    unit = stripped[-1:].upper() if stripped[-1:].upper() in ("K", "M", "G") else ""
    examples = "give e.g. 2G, 500M or 1000000 (or omit the option to keep no graph)"
    try:
        size = float(stripped[:-1] if unit else stripped) * _UNITS[unit]  # 1e300G: finite, times 2**30 is not
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in bytes; {examples}") from None
    if not math.isfinite(size):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite size in bytes; {examples}")
    if size < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is a negative size in bytes; {examples}")
    return int(size)
