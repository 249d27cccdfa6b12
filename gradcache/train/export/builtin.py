"""A built-in encoder (SimCLR's or CLIP's, from a preset of gradcache.models) as `model.safetensors` +
`config.json`, which `gradcache.models.from_pretrained(folder)` rebuilds; a ResNet image encoder also as a plain
torchvision ResNet state dict (`torchvision_<preset>.safetensors`), which loads into `torchvision.models.<preset>`
once its stem is the one trained (a 3x3 stride-1 `conv1` and no max-pool for images of 64 pixels or less) and
its normalisation too (GroupNorm(32, c) under `--norm group`), with `fc` an identity.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from torch import nn

from gradcache.models import PretrainedConfig, ResNetEncoder
from gradcache.models.pretrained import CONFIG_FILE, WEIGHTS_FILE

TORCHVISION_FILE = "torchvision_{preset}.safetensors"


def torchvision_loading_lines(preset: str, encoder: ResNetEncoder, path: str) -> list[str]:
    """The Python lines that build `torchvision.models.<preset>` as `encoder` was built and load `path` into it."""
    norm = type(encoder.net.bn1).__name__
    norm_layer = (f"norm_layer=lambda channels: torch.nn.GroupNorm({encoder.net.bn1.num_groups}, channels)"
                  if norm == "GroupNorm" else "")
    lines = ["import torch, torchvision", "from safetensors.torch import load_file",
             f"net = torchvision.models.{preset}({norm_layer})"]
    if isinstance(encoder.net.maxpool, nn.Identity):  # the small stem
        lines += ["net.conv1 = torch.nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)",
                  "net.maxpool = torch.nn.Identity()"]
    lines += ["net.fc = torch.nn.Identity()  # features, as trained (no classifier)",
              f'net.load_state_dict(load_file("{path}"))']
    return lines


def write_built_in_folder(model: nn.Module, config: PretrainedConfig, image_encoder: nn.Module,
                          folder: str | os.PathLike, use: list[str]) -> None:
    """Write `model` (a `SimCLRModel` or `CLIP` built as `config` says) and `config` into `folder`, plus its image
    encoder as a torchvision state dict when it is a `ResNetEncoder`, and a README.md with the loading lines: the
    mode's `use` (its Python lines, "RUN/model" for the folder), then torchvision's."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({key: value.detach().cpu().contiguous() for key, value in model.state_dict().items()},
              folder / WEIGHTS_FILE)
    (folder / CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=2) + "\n", encoding="utf-8")
    sections = [("gradcache", use)]
    if isinstance(image_encoder, ResNetEncoder):
        name = TORCHVISION_FILE.format(preset=config.image_encoder)
        encoder_state = {key: value.detach().cpu().contiguous() for key, value in image_encoder.net.state_dict().items()}
        save_file(encoder_state, folder / name)
        sections.append(("torchvision (the image encoder alone)",
                         torchvision_loading_lines(config.image_encoder, image_encoder, f"RUN/model/{name}")))
    body = "\n\n".join(f"{title}:\n\n```python\n" + "\n".join(lines) + "\n```" for title, lines in sections)
    (folder / "README.md").write_text(
        f"# A gradcache {config.gradcache_architecture} model\n\nImages: {config.preprocessing.get('images', '')}\n\n"
        f"{body}\n\nEmbeddings are unnormalised, as the model returns them; the loss compared them by cosine "
        f"(temperature {config.temperature:.4g}).\n", encoding="utf-8")
