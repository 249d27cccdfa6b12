"""CLIP: image-caption pairs, an image and a text tower, the symmetric contrastive loss with a learned
temperature clamped after each step; scored by cross-modal recall@K and zero-shot classification.

The towers are the built-in ones (an image encoder preset and a byte-level text Transformer), or with
`--model open_clip:ARCH` any open_clip architecture with its own tokenizer (random init, or `--pretrained PATH`).
A SigLIP architecture (one whose open_clip config sets `init_logit_bias`) trains with its own loss, SigLIP's
pairwise sigmoid loss with a learned temperature and bias."""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from gradcache import losses
from gradcache.models import CLIP as ClipModel
from gradcache.models import ByteTokenizer, PretrainedConfig, TextEncoder
from gradcache.models.open_clip import (
    OpenClipModel,
    OpenClipTokenizer,
    open_clip_architecture,
)
from gradcache.train.config import RunConfig
from gradcache.train.data.images.files import list_caption_table, load_caption_table
from gradcache.train.data.images.lazy import LazyImageSet
from gradcache.train.data.images.sets import DataSplits
from gradcache.train.data.order import StepSampler
from gradcache.train.errors import DataError, UsageError
from gradcache.train.eval.dimensions import at_dim, evaluation_dims, truncated
from gradcache.train.eval.embed import embed_images, embed_texts
from gradcache.train.eval.images import retrieval_recall, zero_shot_top1
from gradcache.train.export.builtin import write_built_in_folder
from gradcache.train.export.open_clip import write_open_clip_folder
from gradcache.train.matryoshka_dims import unwrapped
from gradcache.train.modes.backbone import BACKBONE_HELP, backbone_options, build_backbone, check_backbone
from gradcache.train.modes.base import OptionGroups
from gradcache.train.export.model_card import usage_section
from gradcache.train.model_folders import ModelFolderFormat
from gradcache.train.modes.image import SHARD_PATHS, ImageMode, refuse_text_options
from gradcache.train.modes.loaded_model import LoadedModel, ModelRequest
from gradcache.train.modes.patches import check_patches_tile


class CLIP(ImageMode):
    name = "clip"
    help = "CLIP: image-caption pairs, symmetric contrastive loss with a learnable temperature"
    negatives_loss = "clip"
    path_data = f"a CSV/TSV of image paths and captions, or webdataset shards of KEY.jpg with KEY.txt ({SHARD_PATHS})"
    defaults = dict(temperature=0.07, lr=2e-3, batch_size=256, chunk_size=64)
    default_epochs = 4
    trim_padding = True  # TextEncoder ignores masked positions, so trimming is exact (open_clip's tokens have no mask)
    model_help = (f"{BACKBONE_HELP}, or open_clip:ARCH for both towers of an open_clip architecture (random init; "
                  "a SigLIP architecture trains with the sigmoid loss and a learned bias)")
    temperature_help = " (initial; learned)"
    deepspeed_refusal = ("gradcache train clip: the program hands DeepSpeed one encoder and its optimizer, but clip "
                         "trains two towers and the loss's temperature; use --fsdp or DDP")
    folder_formats = (ModelFolderFormat.BUILT_IN, ModelFolderFormat.OPEN_CLIP)

    def add_image_mode_options(self, groups: OptionGroups, default: Callable[[str], Any]) -> None:
        data, model, run = groups.data, groups.model, groups.run
        data.add_argument("--csv-image-key", default=default("csv_image_key"), help="CSV column holding image paths")
        data.add_argument("--csv-caption-key", default=default("csv_caption_key"),
                          help="CSV column holding captions")
        data.add_argument("--csv-separator", default=default("csv_separator"),
                          help="CSV separator (default: tab for .tsv, else comma)")
        model.add_argument("--context-length", type=int, default=default("context_length"),
                           help="most tokens per caption")
        model.add_argument("--text-width", type=int, default=default("text_width"), help="text transformer width")
        model.add_argument("--text-layers", type=int, default=default("text_layers"),
                           help="text transformer layers")
        model.add_argument("--text-heads", type=int, default=default("text_heads"),
                           help="text transformer attention heads")
        model.add_argument("--pretrained", default=default("pretrained"), help="with --model open_clip:ARCH: a local "
                           "open_clip checkpoint file whose weights and temperature (and a SigLIP model's bias) a "
                           "new run starts from (default: random weights)")
        run.add_argument("--max-logit-scale", type=float, default=default("max_logit_scale"),
                         help="clamp of 1/temperature after each step")

    def check_model(self, config: RunConfig) -> None:
        architecture = open_clip_architecture(config.model)
        if architecture is None:
            check_backbone(config)
            if config.pretrained is not None:
                raise UsageError(f"--pretrained loads open_clip weights and needs --model open_clip:ARCH, got --model "
                                 f"{config.model}; drop --pretrained or name an open_clip architecture")
            return
        try:
            from gradcache.integrations.open_clip import (
                check_architecture,  # needs the open-clip extra
            )

            vision = check_architecture(architecture).get("vision_cfg", {})
        except (ImportError, ValueError) as error:
            raise UsageError(f"--model {config.model}: {error}") from error
        if isinstance(vision.get("patch_size"), int) and "timm_model_name" not in vision:  # a ViT of open_clip's own
            check_patches_tile(config.model, config.image_size, vision["patch_size"])
        if config.pretrained is not None and not Path(config.pretrained).is_file():
            raise UsageError(f"--pretrained {config.pretrained!r} is not a file; give a local open_clip checkpoint "
                             "(.pt, .bin or .safetensors); this program never downloads weights")

    def load_path(self, path: Path, config: RunConfig) -> DataSplits:
        return load_caption_table(path, config.image_size, config.test_size, config.data_seed,
                                  image_key=config.csv_image_key, caption_key=config.csv_caption_key,
                                  separator=config.csv_separator)

    def list_path(self, path: Path, config: RunConfig) -> LazyImageSet:
        return list_caption_table(path, config.image_size, image_key=config.csv_image_key,
                                  caption_key=config.csv_caption_key, separator=config.csv_separator)

    def load_data(self, config: RunConfig) -> DataSplits:
        data = super().load_data(config)
        if data.test.captions is None:
            raise DataError(f"--data {config.data} has no captions; CLIP needs image-caption pairs")
        return data

    def batches(self, config: RunConfig, data: DataSplits, sampler: StepSampler) -> DataLoader:
        return self.image_batches(config, data, sampler, None, caption_tokenizer(config))

    def build_model(self, config: RunConfig) -> nn.Module:
        architecture = open_clip_architecture(config.model)
        if architecture is not None:
            return OpenClipModel(architecture, config.image_size)
        text = TextEncoder(ByteTokenizer.vocab_size, context_length=config.context_length, width=config.text_width,
                           layers=config.text_layers, heads=config.text_heads)
        return ClipModel(build_backbone(config), text, embed_dim=config.projection_dim)

    def build_loss(self, config: RunConfig) -> nn.Module:
        """ClipLoss at --temperature, learnable; for an open_clip architecture its own loss (`open_clip_loss`):
        SigLipLoss at the architecture's initial bias for a SigLIP one."""
        options = dict(tile_size=config.tile_size, queue_size=config.queue_size, queue_warmup=config.queue_warmup)
        architecture = open_clip_architecture(config.model)
        if architecture is None:
            return losses.ClipLoss(temperature=config.temperature, learnable=True, **options)
        from gradcache.integrations.open_clip import open_clip_loss  # the open-clip extra, only when asked

        return open_clip_loss(architecture, config.temperature, **options)

    def initialise(self, config: RunConfig, model: nn.Module, loss: nn.Module) -> None:
        if config.pretrained is not None:  # the checkpoint's weights, its learned temperature (and SigLIP's bias)
            pretrained = model.load_pretrained(config.pretrained)
            with torch.no_grad():
                own = unwrapped(loss)  # the mode's loss, inside a Matryoshka with --matryoshka-dims
                own.logit_scale.copy_(pretrained.logit_scale)
                if isinstance(own, losses.SigLipLoss):
                    own.bias.copy_(pretrained.bias)

    def embedding_width(self, config: RunConfig) -> int:
        architecture = open_clip_architecture(config.model)
        if architecture is None:
            return config.projection_dim
        import open_clip  # check_model has found it and the architecture

        return open_clip.get_model_config(architecture)["embed_dim"]

    def encoders(self, model: nn.Module, guide: nn.Module | None = None) -> list[nn.Module]:
        return [model.image_tower, model.text_tower]

    def after_step(self, config: RunConfig, loss: nn.Module) -> None:
        with torch.no_grad():  # 1 / temperature <= --max-logit-scale, in ClipLoss and SigLipLoss alike
            unwrapped(loss).logit_scale.clamp_(max=math.log(config.max_logit_scale))

    def metrics(self, config: RunConfig, model: nn.Module, data: DataSplits,
                device: torch.device) -> dict[str, float]:
        """Recall@1/5/10 both ways with their chance levels, and zero-shot top-1 where the data has classes; with
        `--matryoshka-dims`, both again at each narrower width (`<metric>@<d>`; the chance levels do not change)."""
        tokenizer = caption_tokenizer(config)
        images = embed_images(model.encode_image, data.test.images, device)
        texts = embed_texts(model.encode_text, tokenizer, data.test.captions, device)
        prompts = None
        if data.test.labels is not None and data.test.class_names:
            prompt_texts = data.test.class_prompts or [[f"a photo of a {name}"] for name in data.test.class_names]
            prompts = [embed_texts(model.encode_text, tokenizer, p, device) for p in prompt_texts]  # (P_c, D) each
        metrics = _scores(images, texts, prompts, data)
        for dim in evaluation_dims(config.matryoshka_dims, images.shape[1]):
            cut = _scores(truncated(images, dim), truncated(texts, dim),
                          None if prompts is None else [truncated(p, dim) for p in prompts], data)
            metrics.update(at_dim({k: v for k, v in cut.items() if not k.startswith("chance_")}, dim))
        return metrics

    def export(self, config: RunConfig, model: nn.Module, loss: nn.Module, folder: Path) -> None:
        """open_clip's own files for `--model open_clip:ARCH`, else gradcache's built-in format; both at the trained
        temperature."""
        loss = unwrapped(loss)  # a Matryoshka sum trains one temperature (and bias)
        if open_clip_architecture(config.model) is not None:
            write_open_clip_folder(model, loss.logit_scale, folder, config.pretrained, getattr(loss, "bias", None))
            return
        text = dict(vocab_size=ByteTokenizer.vocab_size, context_length=config.context_length,
                    width=config.text_width, layers=config.text_layers, heads=config.text_heads)
        preprocessing = {**self.image_preprocessing(config),
                         "tokenizer": f"gradcache.models.ByteTokenizer(context_length={config.context_length})"}
        pretrained = PretrainedConfig(self.name, config.model, backbone_options(config), config.image_size,
                                      config.projection_dim, text_encoder=text, temperature=loss.temperature,
                                      preprocessing=preprocessing)
        use = ["import gradcache.models", 'model = gradcache.models.from_pretrained("RUN/model")',
               'tokenizer = gradcache.models.read_pretrained_config("RUN/model").tokenizer()',
               "image_embeddings = model.encode_image(images)",
               'text_embeddings = model.encode_text(**tokenizer(["a large red star"]))']
        write_built_in_folder(model, pretrained, model.image_tower.encoder, folder, use)

    # --- in use: gradcache encode, eval, mine -----------------------------------------------------------
    def image_model(self, model: nn.Module, source: str, device: torch.device, image_size: int, tokenizer,
                    **loaded) -> LoadedModel:
        return LoadedModel(self, source, model, device, tokenizer=tokenizer, encode_query=model.encode_text,
                           encode_passage=model.encode_text, encode_image=model.encode_image, image_size=image_size,
                           **loaded)

    def caption_tokenizer(self, config: RunConfig) -> ByteTokenizer | OpenClipTokenizer:
        return caption_tokenizer(config)

    def folder_tokenizer(self, config: PretrainedConfig) -> ByteTokenizer:
        return config.tokenizer()

    def load_folder(self, request: ModelRequest, folder: Path, found: ModelFolderFormat) -> LoadedModel:
        """A built-in export (ImageMode.load_folder), or an open_clip one (modes/open_clip_folder.py)."""
        if found != ModelFolderFormat.OPEN_CLIP:
            return super().load_folder(request, folder, found)
        from gradcache.train.modes.open_clip_folder import load_open_clip_folder

        refuse_text_options(request, found)
        return load_open_clip_folder(self, request, folder)

    def card_usage(self, config: RunConfig, where: str) -> str:
        """An open_clip export: open_clip's own preprocessing and eval mode; a built-in one as ImageMode says."""
        if open_clip_architecture(config.model) is None:
            return super().card_usage(config, where)
        return usage_section([
            "import open_clip",
            f'model, _, preprocess = open_clip.create_model_and_transforms("local-dir:{where}")',
            "model.eval()  # evaluation mode: dropout off",
            "image_embeddings = model.encode_image(torch.stack([preprocess(image) for image in pil_images]))"])

    def summary(self, loss: nn.Module) -> dict[str, Any]:
        """The learned temperature, and a SigLIP loss's learned bias."""
        own = unwrapped(loss)
        if isinstance(own, losses.SigLipLoss):
            return {"temperature": own.temperature, "bias": float(own.bias.detach())}
        return {"temperature": own.temperature}


def _scores(images: np.ndarray, texts: np.ndarray, prompts: list[np.ndarray] | None,
            data: DataSplits) -> dict[str, float]:
    """Recall both ways of (N, D) unit image and caption embeddings, and zero-shot top-1 from each class's
    (P_c, D) unit prompt embeddings (their mean, normalised) where the data has classes."""
    scores = retrieval_recall(images, texts, data.test.captions)
    if prompts is not None:
        classes = np.stack([p.mean(0) for p in prompts])  # (C, D)
        classes /= np.linalg.norm(classes, axis=1, keepdims=True)
        scores["zero_shot_top1"] = zero_shot_top1(images, data.test.labels, classes)
    return scores


def caption_tokenizer(config: RunConfig) -> ByteTokenizer | OpenClipTokenizer:
    """The run's caption tokenizer: the built-in byte tokenizer, or the open_clip architecture's own."""
    architecture = open_clip_architecture(config.model)
    return ByteTokenizer(config.context_length) if architecture is None else OpenClipTokenizer(architecture)
