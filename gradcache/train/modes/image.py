"""What the image modes (SimCLR, CLIP) share: the image options, the `--model` presets of gradcache.models
(modes/backbone.py), and the data: a built-in image set by name or a path in the mode's own format."""
from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gradcache.models.pretrained import IMAGE_INPUT
from gradcache.train.config import RunConfig
from gradcache.train.data.bad_data import BadShare, CountedBatches
from gradcache.train.data.held_out import held_out_size
from gradcache.train.data.images.files import BUILT_IN_DATA
from gradcache.train.data.images.lazy import LazyImageSet
from gradcache.train.data.images.sets import DataSplits
from gradcache.train.data.images.shards import (
    ShardBatches,
    ShardSet,
    decode_head,
    find_shards,
    is_shard_spec,
    load_shards,
    shard_loader,
)
from gradcache.train.data.bad_data import CountedBatches
from gradcache.train.data.images.training_batches import training_batches
from gradcache.train.data.order import StepSampler
from gradcache.train.errors import DataError, UsageError
from gradcache.train.modes.backbone import BACKBONE_HELP, check_backbone
from gradcache.train.export.model_card import usage_section
from gradcache.train.model_folders import ModelFolderFormat
from gradcache.train.modes.base import Mode, OptionGroups
from gradcache.train.modes.loaded_model import LoadedModel, ModelRequest


def refuse_text_options(request: ModelRequest, found: ModelFolderFormat) -> None:
    """A text model folder's prompts, asked of an image model's folder: UsageError naming them."""
    if request.prompts != (None, None):
        raise UsageError(f"--query-prompt and --passage-prompt apply to text models; MODEL {request.name} is a "
                         f"{found.value} folder (drop them)")


# where webdataset shards are, for the image modes' --data help
SHARD_PATHS = "a .tar, a folder of them, or a pattern such as 'shards/part-{000..099}.tar'; streamed"

class ImageMode(Mode):
    """A mode that trains an image encoder on images decoded to `--image-size`; subclasses read a path with
    `load_path` and may add to the options with `add_image_mode_options`."""

    items = "images"
    model_help: str = BACKBONE_HELP  # what --model names in this mode
    worker_work = "decoding and augmenting images"
    built_in_help = f"a built-in data set ({', '.join(BUILT_IN_DATA)}: procedural shapes, scikit-learn's digits)"
    card_hidden = ("max_length",)
    folder_formats = (ModelFolderFormat.BUILT_IN,)  # gradcache.models.from_pretrained, of this mode's architecture

    def card_usage(self, config: RunConfig, where: str) -> str:
        """A built-in export: torchvision's preprocessing as trained, and eval mode (BatchNorm, dropout)."""
        size = config.image_size
        return usage_section([
            "from torchvision import transforms",
            f"preprocess = transforms.Compose([transforms.Resize({size}), transforms.CenterCrop({size}),",
            "                                 transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.5] * 3)])"
            "  # [-1, 1], as trained",
            "model.eval()  # evaluation mode (net.eval() for the torchvision encoder): BatchNorm's running "
            "statistics, no dropout",
            "images = torch.stack([preprocess(image.convert('RGB')) for image in pil_images])"])

    # --- in use: gradcache encode, eval, mine -----------------------------------------------------------
    def loaded_from_run(self, request: ModelRequest, run: Path, config: RunConfig, model, meta,
                        source: str) -> LoadedModel:
        if request.max_length is not None:
            raise UsageError(f"--max-length applies to text models; the {config.mode} run {run} tokenises captions "
                             "as it was trained (drop --max-length)")
        return self.image_model(model, source, request.device, config.image_size, self.caption_tokenizer(config),
                                config=config, meta=meta)

    def image_model(self, model, source: str, device, image_size: int, tokenizer, **loaded) -> LoadedModel:
        """A built-in `model` of this mode (a run's, or `from_pretrained`'s) ready for the commands, `tokenizer`
        its captions' (None: it embeds images alone)."""
        raise NotImplementedError

    def caption_tokenizer(self, config: RunConfig):
        """A run's tokenizer of captions, or None: it embeds images alone."""
        return None

    def reads_folder(self, found: ModelFolderFormat, folder: Path) -> bool:
        """A built-in folder of this mode's architecture (its config.json's `gradcache_architecture`)."""
        if found != ModelFolderFormat.BUILT_IN:
            return super().reads_folder(found, folder)
        from gradcache.models.pretrained import ARCHITECTURE_KEY, CONFIG_FILE

        try:
            return json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8")).get(ARCHITECTURE_KEY) == self.name
        except (OSError, ValueError, AttributeError):
            return False

    def load_folder(self, request: ModelRequest, folder: Path, found: ModelFolderFormat) -> LoadedModel:
        """An exported built-in encoder (gradcache.models.from_pretrained)."""
        from gradcache.models import from_pretrained, read_pretrained_config

        refuse_text_options(request, found)
        if request.max_length is not None or request.pooling is not None:
            raise UsageError(f"--max-length and --pooling apply to text models; MODEL {request.name} is a built-in "
                             "image encoder that tokenises as it was trained (drop them)")
        try:
            config = read_pretrained_config(folder)
            model = from_pretrained(folder).to(request.device).eval()
        except (ValueError, OSError) as error:
            raise UsageError(f"MODEL {request.name}: {error}") from error
        return self.image_model(model, f"exported {config.gradcache_architecture} model {folder}", request.device,
                                config.image_size, self.folder_tokenizer(config))

    def folder_tokenizer(self, config):
        """A built-in folder's tokenizer of captions (from its `PretrainedConfig`), or None: it embeds images
        alone."""
        return None

    def add_options(self, groups: OptionGroups, default: Callable[[str], Any]) -> None:
        groups.data.add_argument("--image-size", type=int, default=default("image_size"),
                                 help="images are decoded or rendered at this side")
        groups.data.add_argument("--eval-data", default=default("eval_data"),
                                 help=f"a held-out set apart from the training data ({self.path_data}), decoded at "
                                 "start and scored by every evaluation; the training data is then used whole "
                                 "(default: --test-size images of --data held out by a seeded permutation)")
        groups.data.add_argument("--shuffle-buffer", type=int, default=default("shuffle_buffer"),
                                 help="webdataset shards: samples each loader worker shuffles among")
        groups.data.add_argument("--train-num-samples", type=int, default=default("train_num_samples"),
                                 help="webdataset shards: samples per epoch (default: counted once from the shards' "
                                 "headers and recorded in the run)")
        groups.model.add_argument("--model", default=default("model"), help=self.model_help)
        groups.model.add_argument("--width", type=int, default=default("width"),
                                  help="convnet: channels of the first stage")
        groups.model.add_argument("--norm", default=default("norm"), choices=["group", "batch"],
                                  help="convnet/resnet normalisation (group: per-example, exact under gradcache; the "
                                  "convnet standardises its conv weights with it; batch: per-chunk statistics under "
                                  "gradcache/naive)")
        groups.model.add_argument("--projection-dim", type=int, default=default("projection_dim"),
                                  help="embedding size of the loss")
        groups.output.add_argument("--knn-k", type=int, default=default("knn_k"), help="kNN evaluation: neighbours")
        groups.output.add_argument("--knn-temperature", type=float, default=default("knn_temperature"),
                                   help="kNN evaluation: vote temperature")
        self.add_image_mode_options(groups, default)

    def add_image_mode_options(self, groups: OptionGroups, default: Callable[[str], Any]) -> None:
        """The options of this image mode alone."""

    def check_model(self, config: RunConfig) -> None:
        check_backbone(config)

    def load_data(self, config: RunConfig) -> DataSplits:
        """A built-in data set by name (`BUILT_IN_DATA`), or a path in this mode's format; with `--eval-data`, the
        training data whole (a built-in set: its training split) and the --eval-data set, decoded, held out."""
        if config.train_num_samples is not None and not is_shard_spec(config.data):
            raise UsageError(f"--train-num-samples sets the epoch length of webdataset shards; --data {config.data} is "
                             "not shards (its epoch is every training image): drop --train-num-samples")
        if config.eval_data is not None:
            return self._with_eval_data(config)
        if config.data in BUILT_IN_DATA:
            return BUILT_IN_DATA[config.data](config)
        if is_shard_spec(config.data):
            return self._shards(config, held_out=True)
        return self.load_path(self._existing(config.data, "--data"), config)

    def _shards(self, config: RunConfig, held_out: bool) -> DataSplits:
        return load_shards(config.data, config.image_size, held_out_size(config.test_size, None, "images"),
                           config.data_seed,
                           captions=self.name == "clip", shuffle_buffer=config.shuffle_buffer,
                           train_num_samples=config.train_num_samples, held_out=held_out)

    def _with_eval_data(self, config: RunConfig) -> DataSplits:
        if is_shard_spec(config.eval_data):
            test = decode_head(find_shards(config.eval_data, "--eval-data"), sys.maxsize, config.image_size,
                               self.name == "clip", "--eval-data", [])
        else:
            evaluation = self.list_path(self._existing(config.eval_data, "--eval-data", built_in=False), config)
            test = evaluation.decoded("--eval-data")
        if config.data in BUILT_IN_DATA:
            train = BUILT_IN_DATA[config.data](config).train
        elif is_shard_spec(config.data):
            train = self._shards(config, held_out=False).train
        else:
            train = self.list_path(self._existing(config.data, "--data"), config)
        train.skipped.extend(test.skipped)
        return DataSplits(train=train, test=test, name=f"{config.data} (evaluated on {config.eval_data})")

    def _existing(self, path: str, flag: str, built_in: bool = True) -> Path:
        if not Path(path).exists():
            names = f"{' or '.join(map(repr, BUILT_IN_DATA))}, or " if built_in else ""
            raise DataError(f"{flag} {path!r} does not exist; give {names}{self.path_data}")
        return Path(path)

    def resolve(self, config: RunConfig, data: DataSplits) -> RunConfig:
        """Shards: the epoch length counted at start, recorded so that a resume does not count again."""
        if isinstance(data.train, ShardSet) and config.train_num_samples is None:
            return dataclasses.replace(config, train_num_samples=len(data.train))
        return config

    def image_batches(self, config: RunConfig, data: DataSplits, sampler: StepSampler, augmentation: Callable | None,
                      tokenizer: Callable | None) -> CountedBatches:
        """SimCLR view pairs (tokenizer None) or CLIP (images, tokens) batches, from files or shards."""
        if not isinstance(data.train, ShardSet):
            return training_batches(data.train, sampler, augmentation, tokenizer, config.workers,
                                    config.max_bad_share)
        batches = ShardBatches(data.train, sampler.seed, sampler.batch_size, sampler.start_step, sampler.total_steps,
                               sampler.rank, sampler.world_size, config.workers, augmentation, tokenizer)
        return CountedBatches(shard_loader(batches, config.workers), BadShare(config.max_bad_share,
                                                                              data.train.skipped))

    def load_path(self, path: Path, config: RunConfig) -> DataSplits:
        """The data at `path` with --test-size of it held out."""
        raise NotImplementedError

    def list_path(self, path: Path, config: RunConfig) -> LazyImageSet:
        """The data at `path`, whole, as files decoded when drawn."""
        raise NotImplementedError

    def image_preprocessing(self, config: RunConfig) -> dict[str, Any]:
        """How the exported model's images are prepared, as the run prepared them (for its config and README)."""
        return {"images": f"{IMAGE_INPUT}; decoded as trained: RGB, the shorter side resized to {config.image_size}, "
                          f"centre crop {config.image_size} x {config.image_size}",
                "image_size": config.image_size}
