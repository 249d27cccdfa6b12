"""`gradcache eval CLIP_MODEL --data FOLDER --classes FILE`: zero-shot top-1 accuracy of an ImageFolder.

    zero_shot_top1 = 100 / N * sum_i [argmax_c cos(image_i, class_c) == label_i]
    class_c = normalise(mean_p normalise(text(prompt_{c,p})))

with the model's own image and text encoders. The images are every image of `FOLDER/<class name>/` (torchvision's
ImageFolder layout, read by gradcache/train/data/images/files.py's `list_image_folder`, decoded as training
decodes them); an image's label is its folder's name. The candidate classes are those of FILE, in its order.

The classes file (UTF-8), one class a line:

    dog                                   -> the prompt "a photo of a dog."
    cat<TAB>a photo of my {}.             -> "a photo of my cat."
    car<TAB>a photo of a {}.<TAB>a {} on a road.   -> two prompts, their embeddings averaged

A line is the class name, then optionally tab-separated prompt templates in which `{}` stands for the name
(default: `a photo of a {}.`). Blank lines and lines starting with `#` are skipped. Every class folder of FOLDER
must be a class of FILE (FILE may hold more: they are candidates no image carries).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gradcache.train.commands.encode import embed_image_rows, embed_text_rows
from gradcache.train.commands.command_inputs import decode_images
from gradcache.train.modes.loaded_model import LoadedModel
from gradcache.train.data.images.files import list_image_folder
from gradcache.train.errors import DataError
from gradcache.train.eval.images import zero_shot_top1

DEFAULT_TEMPLATE = "a photo of a {}."
NAME_SLOT = "{}"


@dataclass
class ZeroShotClasses:
    """C classes: `names[c]` and its prompts `prompts[c]` (the templates with the name filled in)."""

    names: list[str]
    prompts: list[list[str]]


def read_classes(path: str | os.PathLike) -> ZeroShotClasses:
    """The classes of a classes file (module docstring), in its order.

    Raises:
        DataError: no such file, a template without `{}`, a repeated class, or no class at all (the line named).

    Example:
        >>> read_classes("classes.txt").prompts[0]
        ['a photo of a dog.']
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise DataError(f"cannot read --classes {str(path)!r}: {error}; give a text file of one class a line "
                        "(name, then optionally tab-separated prompt templates with {})") from error
    names: list[str] = []
    prompts: list[list[str]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, *templates = (field.strip() for field in line.split("\t"))
        templates = [template for template in templates if template] or [DEFAULT_TEMPLATE]
        if not name:
            raise DataError(f"--classes {path} line {number}: no class name before the tab")
        for template in templates:
            if NAME_SLOT not in template:
                raise DataError(f"--classes {path} line {number}: the template {template!r} has no {NAME_SLOT} for "
                                f"the class name; write e.g. {DEFAULT_TEMPLATE!r}")
        if name in names:
            raise DataError(f"--classes {path} line {number}: the class {name!r} is repeated; list each class once "
                            "(put all its templates on its line)")
        names.append(name)
        prompts.append([template.replace(NAME_SLOT, name) for template in templates])
    if not names:
        raise DataError(f"--classes {path} holds no class (one class a line)")
    return ZeroShotClasses(names=names, prompts=prompts)


def zero_shot_metrics(model: LoadedModel, data: str | os.PathLike, classes: str | os.PathLike,
                      batch_size: int = 256) -> dict[str, float]:
    """`zero_shot_top1` (%) of the ImageFolder `data` against the classes of file `classes` (module docstring), with
    the counts `images` and `classes`.

    Raises:
        DataError: `data` is not an ImageFolder, a class folder that is not a class of `classes` (named), an image
            that does not decode, or a bad classes file.
    """
    candidates = read_classes(classes)
    folder = list_image_folder(data, model.image_size)
    missing = [name for name in folder.class_names if name not in candidates.names]
    if missing:
        raise DataError(f"--data {data}: the class folder(s) {', '.join(repr(name) for name in missing)} are not "
                        f"classes of --classes {classes}; add a line for each (name, then optionally its templates)")
    index = {name: position for position, name in enumerate(candidates.names)}
    labels = torch.tensor([index[folder.class_names[label]] for label in folder.labels.tolist()])  # (N,) into FILE
    with torch.inference_mode():
        images = embed_image_rows(model, decode_images([Path(path) for path in folder.paths], model.image_size),
                                  batch_size)  # (N, D)
        flat = [prompt for prompts in candidates.prompts for prompt in prompts]
        embedded = embed_text_rows(model, flat, "query", batch_size, "encode prompts")  # (sum P_c, D)
    ends = np.cumsum([len(prompts) for prompts in candidates.prompts])
    means = np.stack([part.mean(0) for part in np.split(embedded, ends[:-1])])  # (C, D)
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    return {"zero_shot_top1": zero_shot_top1(images, labels, means), "images": len(labels),
            "classes": len(candidates.names)}
