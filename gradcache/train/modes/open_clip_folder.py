"""An exported open_clip model folder (gradcache/train/export/open_clip.py: `open_clip_model.safetensors` +
`open_clip_config.json`) as `gradcache encode / eval` use it: loaded as its README says,
`open_clip.create_model("local-dir:FOLDER")` (the architecture at the trained image size), with its tokenizer
(`open_clip.get_tokenizer("local-dir:FOLDER")`); images are decoded at the trained size as training decodes them and
normalised with the folder's own mean and std, as the run's image tower does. The weights are checked against the
folder's `model_cfg` before open_clip builds anything."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gradcache.train.errors import UsageError
from gradcache.train.model_folders import OPEN_CLIP_CONFIG, OPEN_CLIP_WEIGHTS
from gradcache.train.modes.loaded_model import LoadedModel, ModelRequest

if TYPE_CHECKING:
    from gradcache.train.modes.base import Mode

OPEN_CLIP_LOCAL_DIR = (3, 0)  # the first open-clip-torch release that reads "local-dir:FOLDER" (pyproject's floor)


def _check_local_dir(version: str, name: str) -> None:
    """Refuse an open_clip too old to load a folder, naming the version needed (not blaming the folder)."""
    numbers = tuple(int(part) for part in version.split("+")[0].split(".")[:2] if part.isdigit())
    if numbers < OPEN_CLIP_LOCAL_DIR:
        needed = ".".join(map(str, OPEN_CLIP_LOCAL_DIR))
        raise UsageError(f"MODEL {name} is an open_clip folder, which open_clip loads as local-dir:FOLDER from "
                         f"open-clip-torch {needed} on; this one is {version}: pip install -U "
                         "\"gradcache[open-clip]\"")


def _check_open_clip_weights(folder: Path, values: dict) -> None:
    """The folder's weights against its `model_cfg`, from the safetensors header and the model built on the meta
    device (which allocates nothing), as Hugging Face folders are checked (models/huggingface.py check_weights): a
    config edited to huge sizes is refused before anything of its size is built (UsageError naming the file)."""
    from open_clip.model import CLIP, CustomTextCLIP

    from gradcache.models.safetensors_header import tensor_shapes

    weights = folder / OPEN_CLIP_WEIGHTS
    found = tensor_shapes(weights)  # ValueError naming the file for a corrupt header
    config = dict(values["model_cfg"])
    custom = config.pop("custom_text", False) or "hf_model_name" in config.get("text_cfg", {})
    try:
        with torch.device("meta"):
            skeleton = (CustomTextCLIP if custom else CLIP)(**config)
    except (TypeError, ValueError, RuntimeError, OverflowError, KeyError) as error:
        raise UsageError(f"{folder / 'open_clip_config.json'}: its model_cfg builds no open_clip model "
                         f"({str(error).splitlines()[0]}); give the folder gradcache export wrote, unchanged") from error
    expected = {name: tuple(tensor.shape) for name, tensor in skeleton.state_dict().items()}
    differ = [f"{name}: {expected[name]} in open_clip_config.json, {shape} in the weights"
              for name, shape in found.items() if expected.get(name, shape) != shape]
    if differ:
        raise UsageError(f"{weights} does not hold the model its open_clip_config.json describes ({len(differ)} "
                         f"tensors differ, e.g. {'; '.join(differ[:3])}); the folder was edited or mixed: export it "
                         "again")


def load_open_clip_folder(mode: Mode, request: ModelRequest, folder: Path) -> LoadedModel:
    """An exported open_clip model (gradcache/train/export/open_clip.py), loaded by open_clip from the folder.

    The image side takes the program's images in [-1, 1] (B, 3, S, S) and applies open_clip's normalisation,
    (x / 2 + 1 / 2 - mean) / std with the folder's `preprocess_cfg` mean and std: the run's image tower exactly.
    """
    import json

    from gradcache.models.open_clip import OpenClipTokenizer

    name, device = request.name, request.device
    if request.max_length is not None or request.pooling is not None:
        raise UsageError(f"--max-length and --pooling apply to text models; MODEL {name} is an open_clip model that "
                         "tokenises as it was trained (drop them)")
    try:
        import open_clip

        _check_local_dir(open_clip.__version__, name)
        location = f"local-dir:{folder}"
        values = json.loads((folder / OPEN_CLIP_CONFIG).read_text(encoding="utf-8"))
        image_size = int(values.get("gradcache", {}).get("image_size")
                         or values["model_cfg"]["vision_cfg"]["image_size"])
        _check_open_clip_weights(folder, values)  # before open_clip builds what the config says
        model = open_clip.create_model(location).to(device).eval()
        tokenizer = OpenClipTokenizer(location)
    except ImportError as error:
        raise UsageError(f"MODEL {name} is an open_clip model: pip install \"gradcache[open-clip]\"") from error
    except (ValueError, OSError, KeyError, TypeError, RuntimeError) as error:
        raise UsageError(f"MODEL {name}: open_clip cannot load it ({error}); give the folder gradcache export "
                         "wrote, unchanged") from error
    preprocess = getattr(model.visual, "preprocess_cfg", {})
    mean = torch.tensor(preprocess.get("mean", model.visual.image_mean), device=device).view(3, 1, 1)
    std = torch.tensor(preprocess.get("std", model.visual.image_std), device=device).view(3, 1, 1)

    def encode_image(images: torch.Tensor) -> torch.Tensor:  # (B, 3, S, S) in [-1, 1] -> (B, D)
        return model.encode_image((images * 0.5 + 0.5 - mean) / std)

    def encode_text(input_ids: torch.Tensor) -> torch.Tensor:  # (B, context length) -> (B, D)
        return model.encode_text(input_ids)

    return LoadedModel(mode, source=f"exported open_clip model {folder}", module=model, device=device,
                       tokenizer=tokenizer, encode_query=encode_text, encode_passage=encode_text,
                       encode_image=encode_image, image_size=image_size)
