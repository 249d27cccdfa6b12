"""DIR/gpu.jsonl: one JSON object a line, appended and flushed to disk as each case ends, so a run stopped at any
case (an OOM that kills the process, a timeout) leaves every row before it."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FILE_NAME = "gpu.jsonl"


class Journal:
    """`write(row)` appends `{**context, **row}` as one line and flushes it to disk."""

    def __init__(self, folder: Path, context: dict[str, Any]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / FILE_NAME
        self.context = context
        self.path.write_text("")  # a run's file holds that run's rows alone

    def write(self, row: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({**self.context, **row}, default=str) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
