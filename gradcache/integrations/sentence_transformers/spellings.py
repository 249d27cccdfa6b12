"""One option, two spellings: this library's and sentence-transformers' (`temperature` or `scale` = 1 / t,
`chunk_size` or `mini_batch_size`), accepted in any combination that agrees, with one rule and one wording."""
from __future__ import annotations

import math
from typing import Any, NoReturn

from gradcache.ranges import is_finite, is_int


def temperature_of(owner: str, temperature: Any, scale: Any, default: float | None) -> float | None:
    """t from `temperature` = t or `scale` = 1 / t, either or both (agreeing to 1e-9), or `default` for neither.

    Raises:
        ValueError: a spelling that is not a finite number > 0, or both given with t * scale != 1; named by
            `owner` (the loss) and the argument names and values.
    """
    for name, value in (("temperature", temperature), ("scale", scale)):
        if value is not None and (not is_finite(value) or value <= 0):
            raise ValueError(f"{owner} got {name}={value!r}; {name} must be a finite number > 0 "
                             "(scale = 1 / temperature).")
    if temperature is not None and scale is not None and not math.isclose(temperature * scale, 1.0, rel_tol=1e-9):
        _disagree(owner, "temperature", temperature, "scale", scale, f"scale = 1 / temperature = {1 / temperature!r}")
    if temperature is not None:
        return float(temperature)
    return 1.0 / scale if scale is not None else default


def count_of(owner: str, name: str, value: Any, peer_name: str, peer_value: Any, default: int) -> int:
    """A count given as `name` (this library's) or `peer_name` (sentence-transformers'), either or both (equal),
    or `default` for neither.

    Raises:
        TypeError: a spelling that is not an int. ValueError: one below 1, or both given and different. Each
            names `owner` (the loss) and the argument names and values.
    """
    for spelling, given in ((name, value), (peer_name, peer_value)):
        if given is None:
            continue
        if not is_int(given):
            raise TypeError(f"{owner} got {spelling}={given!r}; {spelling} must be an int >= 1.")
        if given < 1:
            raise ValueError(f"{owner} got {spelling}={given!r}; {spelling} must be an int >= 1.")
    if value is not None and peer_value is not None and value != peer_value:
        _disagree(owner, name, value, peer_name, peer_value, f"{peer_name} is sentence-transformers' name for {name}")
    return value if value is not None else peer_value if peer_value is not None else default


def _disagree(owner: str, name: str, value: Any, peer_name: str, peer_value: Any, relation: str) -> NoReturn:
    raise ValueError(
        f"{owner} got {name}={value!r} and {peer_name}={peer_value!r}, which disagree ({relation}): they are one "
        "option spelled two ways; give one of them, or values that agree."
    )


class PeerSpellings:
    """sentence-transformers' names for a loss's `temperature` (that of `self.loss`) and `chunk_size`, read-only:
    `scale` = 1 / temperature and `mini_batch_size` = chunk_size."""

    loss: Any
    chunk_size: int

    @property
    def temperature(self) -> float:
        return self.loss.temperature

    @property
    def scale(self) -> float:
        """sentence-transformers' spelling: 1 / temperature."""
        return 1.0 / self.loss.temperature

    @property
    def mini_batch_size(self) -> int:
        """sentence-transformers' spelling of `chunk_size`."""
        return self.chunk_size
