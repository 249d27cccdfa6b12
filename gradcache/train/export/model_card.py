"""`RUN/model/README.md` as a model card: the loading lines of its format (written by the format's exporter) with
the folder's real path in place of "RUN/model", how to prepare images and put the model in evaluation mode, the
run's training settings and its held-out metrics, as sentence-transformers writes its cards."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from torch import nn

from gradcache.train.config import RunConfig

PLACEHOLDER = "RUN/model"  # what the format writers put where the folder's path goes
SETTINGS = ("model", "data", "strategy", "batch_size", "chunk_size", "steps", "epochs", "optimizer", "lr", "warmup",
            "weight_decay", "temperature", "precision", "image_size", "max_length", "matryoshka_dims", "queue_size",
            "seed", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets")  # and the run's kind's own fields


class Exporter(Protocol):
    """What export asks of a mode or kind (gradcache/train/modes/base.py `Mode`): its folder, and its card's lines
    (`card_usage`: the section that prepares images and switches to evaluation mode, `usage_section`, or "")."""

    card_hidden: tuple[str, ...]

    def reads_folder(self, found: Any, folder: Path) -> bool: ...

    def export(self, config: RunConfig, model: nn.Module, loss: nn.Module, folder: Path) -> None: ...

    def card_command(self, config: RunConfig) -> str: ...

    def card_settings(self) -> tuple[str, ...]: ...

    def card_usage(self, config: RunConfig, where: str) -> str: ...


def write_model_card(folder: str | os.PathLike, output: str | os.PathLike, config: RunConfig,
                     metrics: dict[str, Any] | None, mode: Exporter) -> None:
    """Complete `folder`/README.md (the export being written, to be renamed to `output`): the real path of `output`,
    the image preprocessing and `eval()` lines of an open_clip or built-in export, the command and settings of
    `config` as its `mode` says, and `metrics` (the final held-out evaluation) where given."""
    readme = Path(folder) / "README.md"
    where = str(Path(output).resolve())
    text = readme.read_text(encoding="utf-8").replace(PLACEHOLDER, where)
    text += mode.card_usage(config, where)
    given = {name: getattr(config, name) for name in (*SETTINGS, *mode.card_settings())
             if getattr(config, name) is not None and name not in mode.card_hidden}
    text += f"\n## Training\n\nTrained with `{mode.card_command(config)}`:\n\n"
    text += "| setting | value |\n|---|---|\n" + "".join(
        f"| `--{name.replace('_', '-')}` | {_cell(value)} |\n" for name, value in given.items())
    if metrics:
        scores = {key: value for key, value in metrics.items() if isinstance(value, (int, float))
                  and not isinstance(value, bool)}
        counts = " (percent; `nonzeros_*` are counts)" if any(key.startswith("nonzeros_") for key in scores) else \
            " (percent)"
        text += f"\n## Metrics\n\nOn the run's held-out split, at the end of training{counts}:\n\n"
        text += "| metric | value |\n|---|---|\n" + "".join(
            f"| {key} | {value:.2f} |\n" for key, value in sorted(scores.items()))
    readme.write_text(text, encoding="utf-8")


def usage_section(lines: list[str]) -> str:
    """The card's section of the Python `lines` that prepare images and switch to evaluation mode (a mode's
    `card_usage`)."""
    return "\n## Images and evaluation mode\n\n```python\nimport torch\n" + "\n".join(lines) + "\n```\n"


def _cell(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return f"`{value}`" if isinstance(value, str) else str(value)
