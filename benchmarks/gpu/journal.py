"""DIR/gpu.jsonl: one JSON object a line, the whole file replaced as each case ends (benchmarks/atomic_output.py:
a temporary file in DIR, flushed to disk, renamed over gpu.jsonl), so a run stopped at any case (an OOM that kills
the process, a timeout) leaves every row before it, and a gpu.jsonl that is a link is replaced by the run's own
file, never written through: the file it pointed to is left untouched."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.atomic_output import replaced

FILE_NAME = "gpu.jsonl"


class Journal:
    """`write(row)` adds `{**context, **row}` as one line, the file replaced whole and flushed to disk."""

    def __init__(self, folder: Path, context: dict[str, Any]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / FILE_NAME
        self.context = context
        self.lines: list[str] = []  # a run's file holds that run's rows alone
        self._replace()

    def write(self, row: dict[str, Any]) -> None:
        self.lines.append(json.dumps({**self.context, **row}, default=str) + "\n")
        self._replace()

    def _replace(self) -> None:
        with replaced(self.path, encoding="utf-8") as handle:
            handle.writelines(self.lines)


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
