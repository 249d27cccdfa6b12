"""Which weights a model folder holds and which a model class adds on top of its base model, read without loading
a weight: the folder's safetensors headers, and the class built on the meta device. What `Mode.random_heads`
asks of a folder (a SPLADE run on a folder without a masked-language-model head)."""
from __future__ import annotations

from pathlib import Path

import torch

from gradcache.models.safetensors_header import tensor_shapes


def stored_weight_names(folder: Path) -> set[str] | None:
    """The names of every tensor in `folder`'s *.safetensors files; None when it holds none (a pytorch_model.bin
    alone, whose names cannot be read without unpickling it)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    return {name for file in files for name in tensor_shapes(file)}


def head_weights(folder: Path, auto_class: str) -> list[str]:
    """The weights transformers' `auto_class` (e.g. "AutoModelForMaskedLM": BERT's cls.predictions.*) of
    `folder`'s config.json has beyond its base model, in the model's order; [] for a config without such a class."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    try:
        with torch.device("meta"):
            model = getattr(transformers, auto_class).from_config(config)
    except ValueError:  # no class of that task for this architecture
        return []
    prefix = model.base_model_prefix + "."
    return [name for name in model.state_dict() if not name.startswith(prefix)]


def missing_head(folder: Path, auto_class: str) -> list[str]:
    """`head_weights(folder, auto_class)` when `folder`'s safetensors hold none of them (the head would start
    random), else []; [] too when the names cannot be read (`stored_weight_names` None)."""
    head = head_weights(folder, auto_class)
    stored = stored_weight_names(folder)
    if stored is None or any(name in stored for name in head):
        return []
    return head


def listed(names: list[str], shown: int = 3) -> str:
    """The first `shown` of `names`, comma-separated, with ' ...' when there are more."""
    return ", ".join(names[:shown]) + (" ..." if len(names) > shown else "")
