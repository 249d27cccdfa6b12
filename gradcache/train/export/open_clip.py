"""A `--model open_clip:ARCH` run as open_clip's own files: `open_clip_model.safetensors` and
`open_clip_config.json`, the two files open_clip reads from a hub or a local folder.

    open_clip.create_model(ARCH, pretrained="RUN/model/open_clip_model.safetensors", force_image_size=SIZE)
    open_clip.create_model("local-dir:RUN/model")   # the same model: the config holds ARCH at SIZE

load it strictly, at the trained temperature (`logit_scale` = log(1 / t), the loss's). The program trains no
SigLIP bias (its CLIP loss has none): a SigLIP architecture's `logit_bias` is the one the run started from.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from gradcache.models.open_clip import OpenClipModel, weights_loaded_next
from gradcache.train.model_folders import OPEN_CLIP_CONFIG, OPEN_CLIP_WEIGHTS


def open_clip_state_dict(model: OpenClipModel, logit_scale: torch.Tensor,
                         pretrained: str | os.PathLike | None = None,
                         logit_bias: torch.Tensor | None = None) -> tuple[dict[str, torch.Tensor], nn.Module]:
    """The state dict of open_clip's model `model.architecture` at `model.image_size` holding `model`'s towers,
    `logit_scale` and, for SigLIP, `logit_bias`, checked by loading it strictly into a freshly built one (returned
    beside it).

    Args:
        model: the trained towers.
        logit_scale: log(1 / temperature), the trained loss's.
        pretrained: the run's `--pretrained` file (the architecture's config comes from it where given).
        logit_bias: a SigLIP loss's trained bias; None: the reference model's own (the architecture's initial
            one, or `pretrained`'s).
    """
    import open_clip

    start = pretrained if pretrained is not None and Path(pretrained).is_file() else None
    with torch.random.fork_rng(devices=[]), weights_loaded_next():  # the trained state is loaded strictly below
        reference = open_clip.create_model(model.architecture, pretrained=start, force_image_size=model.image_size)
    state = {f"visual.{key}": value for key, value in model.image_tower.visual.state_dict().items()}
    state.update(model.text_tower.model.state_dict())  # open_clip's model with the image tower and scale removed
    state["logit_scale"] = logit_scale.detach().reshape(reference.logit_scale.shape)
    if getattr(reference, "logit_bias", None) is not None:
        bias = reference.logit_bias if logit_bias is None else logit_bias
        state["logit_bias"] = bias.detach().reshape(reference.logit_bias.shape)
    reference.load_state_dict(state, strict=True)  # a key missing or left over is a bug here, not the user's
    return state, reference


def write_open_clip_folder(model: OpenClipModel, logit_scale: torch.Tensor, folder: str | os.PathLike,
                           pretrained: str | os.PathLike | None = None,
                           logit_bias: torch.Tensor | None = None) -> None:
    """Write `open_clip_model.safetensors` and `open_clip_config.json` (open_clip's `model_cfg` at the trained image
    size, and its `preprocess_cfg`) into `folder`."""
    import open_clip
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state, reference = open_clip_state_dict(model, logit_scale, pretrained, logit_bias)
    save_file({key: value.detach().cpu().contiguous() for key, value in state.items()}, folder / OPEN_CLIP_WEIGHTS)
    model_cfg = open_clip.get_model_config(model.architecture)
    model_cfg["vision_cfg"] = {**model_cfg["vision_cfg"], "image_size": model.image_size}
    preprocess = dict(getattr(reference.visual, "preprocess_cfg", {}))
    preprocess.update(size=model.image_size, mean=list(reference.visual.image_mean or preprocess.get("mean", ())),
                      std=list(reference.visual.image_std or preprocess.get("std", ())))
    config = {"model_cfg": model_cfg, "preprocess_cfg": preprocess,
              "gradcache": {"architecture": model.architecture, "image_size": model.image_size}}
    (folder / OPEN_CLIP_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (folder / "README.md").write_text(
        f"# An open_clip {model.architecture} trained by gradcache at {model.image_size} x {model.image_size}\n\n"
        "```python\nimport open_clip\n"
        f'model = open_clip.create_model("{model.architecture}", pretrained="RUN/model/{OPEN_CLIP_WEIGHTS}", '
        f"force_image_size={model.image_size})\n"
        'model = open_clip.create_model("local-dir:RUN/model")  # the same, from the config beside the weights\n'
        f'tokenizer = open_clip.get_tokenizer("{model.architecture}")\n```\n\n'
        "`model.logit_scale.exp()` is 1 / the trained temperature. Images: open_clip's own preprocessing at "
        f"{model.image_size} (its mean and std, in {OPEN_CLIP_CONFIG}).\n", encoding="utf-8")
