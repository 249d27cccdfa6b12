"""SimCLR: two augmented views of each image, one shared encoder, NT-Xent; scored by kNN on held-out images."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from gradcache import losses
from gradcache.models import ProjectionHead, SimCLRModel
from gradcache.train.config import RunConfig
from gradcache.train.data.images.augment import simclr_augmentation
from gradcache.train.data.images.files import load_image_folder
from gradcache.train.data.images.sets import DataSplits
from gradcache.train.data.order import StepSampler, training_batches
from gradcache.train.errors import UsageError
from gradcache.train.eval.dimensions import truncated
from gradcache.train.eval.embed import embed_image_outputs
from gradcache.train.eval.images import knn_top1, pixel_features
from gradcache.train.modes.backbone import build_backbone
from gradcache.train.modes.base import OptionGroups
from gradcache.train.modes.image import ImageMode


class SimCLR(ImageMode):
    name = "simclr"
    help = "SimCLR: two augmented views per image, NT-Xent loss"
    loss_kind = "ntxent"
    path_data = "an ImageFolder root"
    # the tuned default run (`gradcache train`, a few CPU minutes)
    defaults = dict(temperature=0.1, lr=2e-3, batch_size=128, chunk_size=32)
    default_epochs = 6

    def add_image_mode_options(self, groups: OptionGroups, default: Callable[[str], Any]) -> None:
        data, model = groups.data, groups.model
        data.add_argument("--crop-min-scale", type=float, default=default("crop_min_scale"),
                          help="smallest area of the random crop")
        data.add_argument("--jitter-strength", type=float, default=default("jitter_strength"), help="colour "
                          "jitter strength s (SimCLR: brightness, contrast, saturation 0.8 s, hue 0.2 s)")
        data.add_argument("--channel-permutation", type=float, default=default("channel_permutation"),
                          help="chance of permuting the RGB channels of a view (breaks colour relations that hue "
                          "jitter keeps)")
        data.add_argument("--rotation", type=float, default=default("rotation"), help="largest random rotation "
                          "of a view in degrees, corners filled by reflection (for data whose classes survive "
                          "rotation)")
        model.add_argument("--hidden-dim", type=int, default=default("hidden_dim"),
                           help="projection head hidden width")

    def check(self, config: RunConfig) -> None:
        if not 0 < config.crop_min_scale <= 1:
            raise UsageError(f"--crop-min-scale must be in (0, 1], got {config.crop_min_scale}")
        if not 0 <= config.channel_permutation <= 1:
            raise UsageError(f"--channel-permutation is a probability in [0, 1], got {config.channel_permutation}")
        if not 0 <= config.jitter_strength <= 2.5:
            raise UsageError(f"--jitter-strength must be in [0, 2.5] (hue shift 0.2 s at most 0.5), got "
                             f"{config.jitter_strength}")

    def load_path(self, path: Path, config: RunConfig) -> DataSplits:
        return load_image_folder(path, config.image_size, config.test_size, config.data_seed)

    def batches(self, config: RunConfig, data: DataSplits, sampler: StepSampler) -> DataLoader:
        views = simclr_augmentation(config.image_size, crop_scale=(config.crop_min_scale, 1.0),
                                    jitter_strength=config.jitter_strength,
                                    channel_permutation=config.channel_permutation, rotation=config.rotation)
        return training_batches(data.train, sampler, views, None, config.workers)

    def build_model(self, config: RunConfig) -> nn.Module:
        backbone = build_backbone(config)
        head = ProjectionHead(backbone.out_dim, hidden_dim=config.hidden_dim, out_dim=config.projection_dim)
        return SimCLRModel(backbone, head)

    def build_loss(self, config: RunConfig) -> nn.Module:
        return losses.NTXent(temperature=config.temperature, tile_size=config.tile_size,
                             queue_size=config.queue_size, queue_warmup=config.queue_warmup)

    def embedding_width(self, config: RunConfig) -> int:
        return config.projection_dim

    def encoders(self, model: nn.Module, guide: nn.Module | None = None) -> nn.Module:
        return model  # one network shared by both views

    def metrics(self, config: RunConfig, model: nn.Module, data: DataSplits,
                device: torch.device) -> dict[str, float]:
        """kNN on the backbone features h; with `--matryoshka-dims`, also on the first d columns of the projection
        z = g(h), which the loss trains at every d (h is no prefix of anything): `knn_top1@<d>` for every d."""
        dims = config.matryoshka_dims or []
        encode = _features_and_projection(model) if dims else lambda images: (model.embed(images),)
        train, *train_z = embed_image_outputs(encode, data.train.images, device)
        test, *test_z = embed_image_outputs(encode, data.test.images, device)
        metrics = {"knn_top1": _knn(config, train, test, data)}
        for dim in dims:
            metrics[f"knn_top1@{dim}"] = _knn(config, truncated(train_z[0], dim), truncated(test_z[0], dim), data)
        return metrics

    def baselines(self, config: RunConfig, data: DataSplits, initial: dict[str, float]) -> dict[str, float]:
        """kNN on raw pixels, and on the network as initialised (the model at step 0)."""
        train, test = pixel_features(data.train.images, data.test.images)
        return {"knn_top1_raw_pixels": _knn(config, train, test, data),
                "knn_top1_random_init": initial["knn_top1"]}


def _features_and_projection(model: nn.Module) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """images -> (features h, projection z = g(h)), one backbone pass for both."""
    def encode(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = model.embed(images)
        return features, model.head(features)

    return encode


def _knn(config: RunConfig, train, test, data: DataSplits) -> float:
    return knn_top1(train, data.train.labels, test, data.test.labels, k=config.knn_k,
                    temperature=config.knn_temperature)
