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


def masked_lm_head_weights(folder: Path) -> list[str]:
    """The weights AutoModelForMaskedLM of `folder`'s config.json has beyond its base model (the head: BERT's
    cls.predictions.*), in the model's order; [] for a config without a masked-LM class."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    if type(config) not in transformers.MODEL_FOR_MASKED_LM_MAPPING:
        return []
    with torch.device("meta"):
        model = transformers.AutoModelForMaskedLM.from_config(config)
    prefix = model.base_model_prefix + "."
    return [name for name in model.state_dict() if not name.startswith(prefix)]
