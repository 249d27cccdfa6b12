"""LoRA adapters on the text mode's towers, through peft: `--lora-rank R [--lora-alpha A] [--lora-dropout P]
[--lora-targets NAMES]`.

Each tower's Hugging Face model becomes `peft.get_peft_model(model, LoraConfig(...))`: W x + (A / R) B A x on the
target layers, B starting at zero, so step 0 is the pretrained model. Peft freezes the base weights: they get no
gradient and no optimizer state, and a checkpoint holds the adapter alone (checkpoints/model_state.py). The strategy
sees an ordinary module, so GradCache replays LoRA dropout like any other dropout (tests/test_peft.py).

Defaults, said in `--help` and docs/training.md:
- alpha 2 R (E5-Mistral's rank 16 with alpha 32);
- dropout 0.05 (exact under GradCache: replayed in the second pass);
- targets: peft's default for the model type (BERT and MiniLM: query, value; Llama, Mistral, Qwen2: q_proj,
  v_proj), else every Linear layer of the model (peft's "all-linear").
With `--separate-towers` each tower gets its own adapter on its own copy of `--model`.

Every placement trains the adapter alone:
- DDP reduces the adapter's gradients (the frozen base has none).
- `--fsdp`: FSDP2 shards each decoder layer with its frozen and trainable parameters in one unit (it keeps a
  DTensor per parameter, so `requires_grad` stays each parameter's own); the optimizer is built over the adapter's
  shards; `last.dcp` holds the adapter and its optimizer state (checkpoints/sharded.py).
- `--deepspeed`: the engine is given the optimizer over the adapter, so ZeRO partitions (and ZeRO-3 gathers per
  chunk) the frozen weights but keeps float32 master weights and optimizer state for the adapter alone; `last.ds`
  saves the module without its frozen weights (checkpoints/deepspeed_checkpoint.py).
Under all three rank 0 writes `RUN/model` (`write_lora_tower`) from its whole adapter: its own under DDP and
ZeRO-1/2, gathered under `--fsdp` and ZeRO-3.

`RUN/model` holds the merged model as a sentence-transformers folder and the adapter as a PEFT folder in
`adapter/` (`PeftModel.from_pretrained(AutoModel.from_pretrained(MODEL), "RUN/model/adapter")`).
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from gradcache.models import HuggingFaceEncoder
from gradcache.train.config import RunConfig
from gradcache.train.errors import UsageError
from gradcache.train.export.sentence_transformers import (
    ADAPTER_FOLDER,
    adapter_card,
    write_sentence_transformers_folder,
)
from gradcache.train.modes.base_fingerprint import METHODS

DEFAULT_DROPOUT = 0.05
LORA_OPTIONS = ("lora_alpha", "lora_dropout", "lora_targets")  # meaningful only with --lora-rank
_ALL_LINEAR = "all-linear"  # peft's name for every Linear layer (a model without a head has no output layer)
_SUPPORTED = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d)  # and transformers' Conv1D, by name


def lora_targets(text: str) -> list[str]:
    """`--lora-targets`: comma-separated module names (`query,value`; `q_proj,k_proj,v_proj,o_proj`)."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of module names; give e.g. "
                                         "query,value or q_proj,v_proj")
    return names


def add_lora_options(group: argparse._ArgumentGroup, default: Callable[[str], Any]) -> None:
    group.add_argument("--lora-rank", type=int, default=default("lora_rank"), help="train LoRA adapters of this "
                       "rank (peft; pip install -e \".[lora]\"), the base weights frozen: checkpoints hold the adapter "
                       "and its optimizer state, RUN/model the merged model and the adapter in adapter/ (default: "
                       "train every weight)")
    group.add_argument("--lora-alpha", type=float, default=default("lora_alpha"),
                       help="--lora-rank: the LoRA scale numerator, updates scaled by alpha / rank (default: 2 x rank)")
    group.add_argument("--lora-dropout", type=float, default=default("lora_dropout"),
                       help=f"--lora-rank: dropout on the adapters' input, in [0, 1) (default: {DEFAULT_DROPOUT})")
    group.add_argument("--fingerprint", choices=METHODS, default=default("fingerprint"),
                       help="--lora-rank: how the base folder's weight files are fingerprinted when the run starts "
                       "and compared whenever its model is rebuilt: sampled (64 blocks of 64 KiB of a large file: "
                       "an edit between them is not seen) or full (every byte, each rebuild); config, tokenizer and "
                       "module files are hashed whole either way (default: sampled)")
    group.add_argument("--lora-targets", type=lora_targets, default=default("lora_targets"),
                       help="--lora-rank: comma-separated names of the layers to adapt, matched as peft matches them "
                       "(a module's name or its last parts) (default: peft's default for the model type, e.g. "
                       "query,value for BERT and q_proj,v_proj for Llama; else every Linear layer)")


@dataclass(frozen=True)
class LoraSettings:
    """The LoRA options with their defaults filled in."""

    rank: int
    alpha: float
    dropout: float
    targets: list[str] | None  # None: peft's default for the model type, else every Linear layer


def lora_settings(config: RunConfig) -> LoraSettings | None:
    """The run's LoRA settings, or None without `--lora-rank`."""
    if config.lora_rank is None:
        return None
    alpha = 2.0 * config.lora_rank if config.lora_alpha is None else config.lora_alpha
    dropout = DEFAULT_DROPOUT if config.lora_dropout is None else config.lora_dropout
    return LoraSettings(config.lora_rank, alpha, dropout, config.lora_targets)


def import_peft() -> ModuleType:
    """peft, or a UsageError naming the extra that installs it."""
    try:
        import peft
    except ImportError as error:
        raise UsageError('--lora-rank needs the peft package: pip install -e ".[lora]" (or pip install peft), or '
                         "drop --lora-rank to train every weight") from error
    return peft


def _targets(settings: LoraSettings, model: nn.Module) -> tuple[list[str] | str, str]:
    """The target modules for `model`, and where they come from (for the run's first line)."""
    if settings.targets is not None:
        return settings.targets, "given"
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    defaults = peft_default_targets(model_type)
    if defaults is not None:
        return defaults, f"peft's default for {model_type}"
    return _ALL_LINEAR, f"every Linear layer: peft has no default for {model_type}"


def peft_default_targets(model_type: str | None) -> list[str] | None:
    """The layers peft adapts by default in a model of `model_type` (Llama, Qwen2: q_proj, v_proj), or None."""
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    return list(DEFAULTS[model_type]) if model_type in DEFAULTS else None


def wrap_lora(model: nn.Module, settings: LoraSettings, targets: list[str] | str) -> nn.Module:
    """`peft.get_peft_model(model, LoraConfig(...))` at `settings` on the layers `targets` (names as peft matches
    them, or "all-linear"): the base weights frozen, B starting at zero."""
    peft = import_peft()
    config = peft.LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                             target_modules=targets)
    return peft.get_peft_model(model, config)


def add_lora(tower: HuggingFaceEncoder, settings: LoraSettings) -> HuggingFaceEncoder:
    """`tower` with its model wrapped by peft's LoRA (base weights frozen); returns `tower`."""
    import_peft()
    targets, _ = _targets(settings, tower.model)
    tower.model = wrap_lora(tower.model, settings, targets)
    tower.train(tower.training)
    return tower


def describe(tower: HuggingFaceEncoder, settings: LoraSettings) -> str:
    """One line: the settings, the layers adapted and why those, the share of parameters trained."""
    targets, source = _targets(settings, tower.model.get_base_model())
    return lora_line(tower, settings, ", ".join(targets) if isinstance(targets, list) else _ALL_LINEAR, source)


def lora_line(module: nn.Module, settings: LoraSettings, names: str, source: str) -> str:
    """The run's line about its adapters: `settings`, the layers adapted (`names`) and why those (`source`), the
    share of `module`'s parameters trained."""
    trained = sum(p.numel() for p in module.parameters() if p.requires_grad)
    total = sum(p.numel() for p in module.parameters())
    return (f"LoRA rank {settings.rank}, alpha {settings.alpha:g}, dropout {settings.dropout:g} on {names} ({source}): "
            f"{trained:,} of {total:,} parameters trained per tower ({100 * trained / total:.2f}%)")


def check_lora_options(config: RunConfig) -> None:
    """The LoRA options come with `--lora-rank`, and peft is installed."""
    if config.lora_rank is None:
        given = [f"--{name.replace('_', '-')}" for name in LORA_OPTIONS if getattr(config, name) is not None]
        if given:
            raise UsageError(f"{', '.join(given)} set LoRA adapters, which need --lora-rank R (e.g. --lora-rank 16); "
                             "add it, or drop them to train every weight")
        return
    import_peft()


def check_lora_targets(config: RunConfig, folder: Path) -> None:
    """Every `--lora-targets` name matches a layer of `--model` that peft adapts, checked on the model's shapes
    built on the meta device (nothing allocated, the weights unread); peft's own refusals become UsageError."""
    settings = lora_settings(config)
    if settings is None:
        return
    import transformers

    from gradcache.models.sentence_transformers_folder import read_sentence_transformer_folder

    layout = read_sentence_transformer_folder(folder)
    source = folder if layout is None else layout.model_path
    model_config = transformers.AutoConfig.from_pretrained(os.fspath(source), local_files_only=True)
    with torch.device("meta"):
        skeleton = HuggingFaceEncoder(transformers.AutoModel.from_config(model_config))
    names = [name for name, _ in skeleton.model.named_modules() if name]
    for target in settings.targets or []:
        if not any(name == target or name.endswith("." + target) for name in names):
            layers = sorted({name.rsplit(".", 1)[-1] for name, module in skeleton.model.named_modules()
                             if isinstance(module, _SUPPORTED) or type(module).__name__ == "Conv1D"})
            raise UsageError(f"--lora-targets {','.join(settings.targets)}: {target!r} matches no module of --model "
                             f"{config.model}; its layers that LoRA adapts are named {', '.join(layers)}")
    try:
        with torch.device("meta"):
            add_lora(skeleton, settings)
    except ValueError as error:
        raise UsageError(f"--lora-targets {','.join(settings.targets or [])}: peft refuses them on --model "
                         f"{config.model}: {error}") from error


def write_lora_tower(tower: HuggingFaceEncoder, base_folder: Path, max_seq_length: int, folder: Path,
                     **prompts: str | None) -> None:
    """The adapter of `tower` as a PEFT folder in `folder/adapter`, and the model merged with it as a
    sentence-transformers folder in `folder`: the base read again from `base_folder` on CPU, the adapter loaded
    into it as users load it, merged (`merge_and_unload`), then written as a run without LoRA writes its model."""
    peft = import_peft()
    adapter = Path(folder) / ADAPTER_FOLDER
    tower.model.save_pretrained(adapter)  # adapter_config.json + adapter_model.safetensors
    merged = HuggingFaceEncoder(base_folder, pooling=tower.pooling, normalize=tower.normalize,
                                include_prompt=tower.include_prompt)
    merged.model = peft.PeftModel.from_pretrained(merged.model, adapter).merge_and_unload()
    write_sentence_transformers_folder(merged, base_folder, max_seq_length, folder, **prompts)  # query_prompt ...
    base = tower.model.peft_config["default"].base_model_name_or_path
    with open(Path(folder) / "README.md", "a", encoding="utf-8") as readme:
        readme.write(adapter_card(base))
