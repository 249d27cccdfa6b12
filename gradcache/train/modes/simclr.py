"""SimCLR: two augmented views of each image, one shared encoder, NT-Xent; scored by kNN on held-out images."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from gradcache import losses
from gradcache.models import PretrainedConfig, ProjectionHead, SimCLRModel
from gradcache.train.config import RunConfig
from gradcache.train.data.images.augment import simclr_augmentation
from gradcache.train.data.images.files import list_image_folder, load_image_folder
from gradcache.train.data.images.lazy import LazyImageSet, reference_set
from gradcache.train.data.images.sets import DataSplits
from gradcache.train.data.images.shards import ShardSet
from gradcache.train.data.order import StepSampler
from gradcache.train.errors import DataError
from gradcache.train.eval.dimensions import truncated
from gradcache.train.eval.embed import embed_image_outputs
from gradcache.train.eval.images import knn_top1, pixel_features
from gradcache.train.export.builtin import write_built_in_folder
from gradcache.train.modes.loaded_model import LoadedModel
from gradcache.train.modes.backbone import backbone_options, build_backbone
from gradcache.train.modes.base import OptionGroups
from gradcache.train.modes.image import SHARD_PATHS, ImageMode


class SimCLR(ImageMode):
    name = "simclr"
    help = "SimCLR: two augmented views per image, NT-Xent loss"
    negatives_loss = "ntxent"
    path_data = ("an ImageFolder root, or webdataset shards of KEY.jpg with KEY.cls labels for the kNN evaluation "
                 f"({SHARD_PATHS})")
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
        groups.output.add_argument("--eval-reference-size", type=int, default=default("eval_reference_size"),
                                   help="kNN evaluation: the most training images the held-out ones are compared "
                                   "with (drawn once, seeded by --data-seed; the raw-pixel baseline uses the same)")

    def load_path(self, path: Path, config: RunConfig) -> DataSplits:
        return load_image_folder(path, config.image_size, config.test_size, config.data_seed)

    def list_path(self, path: Path, config: RunConfig) -> LazyImageSet:
        return list_image_folder(path, config.image_size)

    def load_data(self, config: RunConfig) -> DataSplits:
        """The data, and the kNN reference set: at most --eval-reference-size training images, decoded once."""
        data = super().load_data(config)
        if data.test.labels is None:
            raise DataError(f"the held-out images of {data.name} have no class (an ImageFolder's sub-folder, a "
                            "shard's KEY.cls); SimCLR's kNN evaluation needs one: add the classes, or give "
                            "--eval-data with them")
        if isinstance(data.train, ShardSet):
            data.reference = data.train.head(config.eval_reference_size or len(data.train), config.data_seed + 1,
                                             "kNN reference")
        else:
            data.reference = reference_set(data.train, config.eval_reference_size, config.data_seed)
        return data

    def batches(self, config: RunConfig, data: DataSplits, sampler: StepSampler) -> DataLoader:
        views = simclr_augmentation(config.image_size, crop_scale=(config.crop_min_scale, 1.0),
                                    jitter_strength=config.jitter_strength,
                                    channel_permutation=config.channel_permutation, rotation=config.rotation)
        return self.image_batches(config, data, sampler, views, None)

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
        train, *train_z = embed_image_outputs(encode, data.reference.images, device)
        test, *test_z = embed_image_outputs(encode, data.test.images, device)
        metrics = {"knn_top1": _knn(config, train, test, data)}
        for dim in dims:
            metrics[f"knn_top1@{dim}"] = _knn(config, truncated(train_z[0], dim), truncated(test_z[0], dim), data)
        return metrics

    def export(self, config: RunConfig, model: nn.Module, loss: nn.Module, folder: Path) -> None:
        """gradcache's built-in format (`gradcache.models.from_pretrained`); a ResNet backbone also for torchvision."""
        pretrained = PretrainedConfig(self.name, config.model, backbone_options(config), config.image_size,
                                      config.projection_dim, hidden_dim=config.hidden_dim,
                                      temperature=config.temperature, preprocessing=self.image_preprocessing(config))
        use = ["import gradcache.models", 'model = gradcache.models.from_pretrained("RUN/model")',
               "features = model.embed(images)  # the representation; model(images) is the projection the loss saw"]
        write_built_in_folder(model, pretrained, model.backbone, folder, use)

    def image_model(self, model: nn.Module, source: str, device: torch.device, image_size: int, tokenizer,
                    **loaded) -> LoadedModel:
        return LoadedModel(self, source, model, device, encode_image=model.embed, image_size=image_size, **loaded)

    def baselines(self, config: RunConfig, data: DataSplits, initial: dict[str, float]) -> dict[str, float]:
        """kNN on raw pixels (the same reference and held-out images), and on the network as initialised (the
        model at step 0)."""
        train, test = pixel_features(data.reference.images, data.test.images)
        return {"knn_top1_raw_pixels": _knn(config, train, test, data),
                "knn_top1_random_init": initial["knn_top1"]}


def _features_and_projection(model: nn.Module) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """images -> (features h, projection z = g(h)), one backbone pass for both."""
    def encode(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = model.embed(images)
        return features, model.head(features)

    return encode


def _knn(config: RunConfig, train, test, data: DataSplits) -> float:
    return knn_top1(train, data.reference.labels, test, data.test.labels, k=config.knn_k,
                    temperature=config.knn_temperature)
