"""`--report-to tensorboard`: the run's logs as TensorBoard scalars, one writer in `RUN/tensorboard/`.

    train/<column>  at step s  =  train_log.csv's <column> in the row of step s   (every column but `step`)
    eval/<metric>   at step s  =  eval_log.csv's <metric> in the row of step s

TensorBoard stores a scalar as float32, so each value is the CSV's number rounded to float32. A new run
removes the event files a run before it left in the folder (as it replaces the CSV logs); a resumed run adds
an event file beside them whose first event tells TensorBoard to drop what the files before it hold from step
`resume_step + 1` on (`purge_step`), as the CSV logs are cut back to the checkpoint's step. Read it with
`tensorboard --logdir RUN/tensorboard`, or several runs with `tensorboard --logdir runs`.
"""
from __future__ import annotations

import time
from pathlib import Path

FOLDER = "tensorboard"
EVENT_FILE_PREFIX = "events.out.tfevents."


class TensorBoardWriter:
    """One `torch.utils.tensorboard.SummaryWriter` in `output_dir/tensorboard`.

    Args:
        output_dir: the run folder.
        resume_step: the checkpoint's step when the run continues one, None for a new run.

    Raises:
        ImportError: the `tensorboard` package is not installed (preflight checks it before a run starts).

    Example:
        >>> writer = TensorBoardWriter("runs/x")
        >>> writer.add_scalars("train", {"loss": 0.5, "lr": 1e-3}, step=1)
        >>> writer.close()
    """

    def __init__(self, output_dir: str | Path, resume_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.folder = Path(output_dir) / FOLDER
        existing = sorted(self.folder.glob(EVENT_FILE_PREFIX + "*")) if self.folder.is_dir() else []
        if resume_step is None:
            for path in existing:
                path.unlink()
        else:
            _after_newest(existing)
        self._writer = SummaryWriter(str(self.folder), purge_step=None if resume_step is None else resume_step + 1)

    def add_scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        """`prefix/<name>` = value at `step`, for each entry of `values`."""
        for name, value in values.items():
            self._writer.add_scalar(f"{prefix}/{name}", value, global_step=step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _after_newest(existing: list[Path]) -> None:
    """Wait, if need be, until a new event file's name sorts after every existing one: TensorBoard reads a
    folder's files in name order, which starts with the second they were opened in, and must read the purge
    of a resumed run after the events it drops."""
    opened = [int(second) for path in existing if (second := path.name[len(EVENT_FILE_PREFIX):].split(".")[0]).isdigit()]
    while opened and int(time.time()) <= max(opened):
        time.sleep(0.05)
