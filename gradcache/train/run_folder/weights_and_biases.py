"""`--report-to wandb`: the run's logs as a Weights & Biases run in `RUN/wandb/`, offline unless asked otherwise.

    train/<column>  at step s  =  train_log.csv's <column> in the row of step s   (every column but `step`)
    eval/<metric>   at step s  =  eval_log.csv's <metric> in the row of step s

W&B's own `WANDB_MODE` decides where the run goes; unset, it is `offline`: no account and no network, the run
written under `RUN/wandb/offline-run-*` for `wandb sync` to upload later. The run's options are its config,
its name is the run folder's, its project `WANDB_PROJECT` (default `gradcache`). Every job of a run folder logs
to the same W&B run id (kept in `RUN/wandb/run_id`), a resumed job as a resume of it; unlike TensorBoard, W&B
cannot drop the steps a killed job logged after its last checkpoint, so those appear in that job's offline
files as the job logged them.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

FOLDER = "wandb"
RUN_ID_FILE = "run_id"


class WandbWriter:
    """One W&B run in `output_dir/wandb`.

    Args:
        output_dir: the run folder.
        resume_step: the checkpoint's step when the run continues one, None for a new run.
        run_options: the run's options (`RunConfig.to_dict()`), the W&B run's config.

    Raises:
        ImportError: the `wandb` package is not installed (preflight checks it before a run starts).

    Example:
        >>> writer = WandbWriter("runs/x", run_options={"lr": 1e-3})
        >>> writer.add_scalars("train", {"loss": 0.5}, step=1)
        >>> writer.close()
    """

    def __init__(self, output_dir: str | Path, resume_step: int | None = None,
                 run_options: dict[str, Any] | None = None) -> None:
        import wandb

        folder = Path(output_dir) / FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / RUN_ID_FILE
        if resume_step is None or not id_file.exists():
            id_file.write_text(secrets.token_hex(4) + "\n")  # W&B's ids: 8 lowercase letters and digits
        self._run = wandb.init(
            dir=str(output_dir), id=id_file.read_text().strip(), resume="allow" if resume_step is not None else None,
            name=Path(output_dir).resolve().name, project=os.environ.get("WANDB_PROJECT", "gradcache"),
            mode=os.environ.get("WANDB_MODE") or "offline", config=run_options or {},
            settings=wandb.Settings(console="off", silent=True, save_code=False, disable_git=True),
        )

    def add_scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        """`prefix/<name>` = value at `step`, for each entry of `values`."""
        self._run.log({f"{prefix}/{name}": value for name, value in values.items()}, step=step)

    def flush(self) -> None:
        """Nothing to do: W&B's service process writes each logged row as it comes."""

    def close(self) -> None:
        import wandb

        self._run.finish()
        # offline, finish() may return before W&B's service process has written the run's file; teardown waits
        # for it, so the run is whole on disk when the program (or its caller) goes on
        wandb.teardown()
