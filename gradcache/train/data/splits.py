"""What every mode's data is, to the loop and the checkpoints: a training set, a held-out set and a name.

A mode's own splits (images: `DataSplits`; text rows: `TextSplits`) add what its batches and evaluation read;
the loop reads only what this protocol names, so a new mode brings its own kind of data without a change here.
"""
from __future__ import annotations

from collections.abc import Sized
from typing import Protocol


class Splits(Protocol):
    """The data of one run: `train` (what the steps draw from, len = examples), `test` (held out), `name`."""

    @property
    def train(self) -> Sized: ...

    @property
    def test(self) -> Sized: ...

    @property
    def name(self) -> str: ...
