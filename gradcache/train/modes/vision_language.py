"""Vision-language retrieval (`gradcache train vlm`): rows whose query and passages are each a text, its images or
both (data/vision_language/), one shared VLM embedder (`VisionLanguageEncoder`: a Qwen2-VL / Qwen2.5-VL or Idefics3 /
SmolVLM model, last-token or mean pooling), InfoNCE over every positive and hard negative of the batch as text's
(`GroupedInfoNCE`); scored by held-out retrieval both ways (eval/vision_language_retrieval.py), at step 0 too.

The vision tower is frozen unless `--train-vision`, and then GradCache runs it in phase (1) alone and reuses its
outputs in phase (3) (`reused_modules`, the library's `reuse_outputs`). `--lora-rank` adapts the language model
alone (`lora_targets`), never the vision tower nor its merger. Its model folders: modes/vision_language_folders.py;
`RUN/model`: a SentenceTransformer folder (export/vision_language.py).

The default run: the `tiny-qwen2-vl` preset (random weights) on the built-in `shapes`, whose held-out images rank
their captions; `metrics.json` holds the metrics of the trained model and of the model at step 0 (`_random_init`;
a pretrained `--model` folder: `_initial`).
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from gradcache import distributed
from gradcache.models import VisionLanguageCollator, VisionLanguageEncoder, build_vision_language_model
from gradcache.models import language_model_lora_targets
from gradcache.models.vision_language import VLM_POOLINGS
from gradcache.models.vision_language_folder import is_vision_language_folder, read_vision_language_folder
from gradcache.models.vision_language_presets import VISION_LANGUAGE_PRESETS
from gradcache.train.config import RunConfig
from gradcache.train.data.order import StepSampler
from gradcache.train.data.text.formats import file_suffixes, folder_names, listed
from gradcache.train.data.vision_language import (
    BUILT_IN_VLM,
    VisionLanguageSplits,
    check_vision_language_lengths,
    load_vision_language_splits,
    vision_language_batches,
)
from gradcache.train.errors import UsageError
from gradcache.train.eval.vision_language import vision_language_embedder
from gradcache.train.eval.vision_language_retrieval import evaluate_vision_language_retrieval
from gradcache.train.export.vision_language import write_vision_language_folder
from gradcache.train.model_folders import ModelFolderFormat
from gradcache.train.modes.base import Mode, OptionGroups
from gradcache.train.modes.base_fingerprint import check_fingerprint, with_base_fingerprint
from gradcache.train.modes.grouped_infonce import GroupedInfoNCE, grouped_matryoshka
from gradcache.train.modes.loaded_model import LoadedModel, ModelRequest
from gradcache.train.modes.lora import (
    LoraSettings,
    add_lora_options,
    check_lora_options,
    lora_line,
    lora_settings,
    peft_default_targets,
    wrap_lora,
)
from gradcache.train.modes.row_options import (
    add_chunking_options,
    add_eval_data_option,
    add_max_length_option,
    add_negatives_option,
    add_prompt_options,
    add_row_key_options,
    check_prompts,
)
from gradcache.train.modes.vision_language_folders import (
    FAMILIES,
    build_encoder,
    check_vision_language_model,
    folder_processor,
    is_preset,
    model_path,
    processor,
)

DEFAULT_PRESET = "tiny-qwen2-vl"
EMBED_BATCH = 32  # inputs per forward when the commands embed (`LoadedModel.embed_inputs`)


class VisionLanguage(Mode):
    name = "vlm"
    help = ("vision-language retrieval: a Qwen2-VL or Idefics3 / SmolVLM embedder on rows of text and images "
            "(text only, image only or both per side), InfoNCE")
    negatives_loss = "infonce"
    path_data = (f"rows of text and images: a {listed(file_suffixes())} file, a folder or pattern of them, or "
                 f"{listed(folder_names())} (save_to_disk); an image is a path under the data file's folder (or "
                 "--image-root), a list of them, or bytes ({'bytes', 'path'} as datasets writes them)")
    # the default run: the tiny-qwen2-vl preset on the built-in shapes (docs/training.md gives its margin)
    defaults = dict(data=BUILT_IN_VLM, model=DEFAULT_PRESET, pooling="last", train_size=4096, batch_size=64,
                    chunk_size=32, lr=1e-3, base_batch_size=64, warmup=10, weight_decay=0.01, temperature=0.05)
    default_epochs = 8
    trim_padding = True  # a VLM with an attention mask ignores the padding columns the strategy trims
    items = "rows"
    built_in_help = (f"'{BUILT_IN_VLM}' (built-in, generated: the shapes and their captions, rows of image -> "
                     "caption, caption -> image and image + place words -> caption; held out: image -> caption)")
    card_hidden = ("image_size",)

    # --- options ----------------------------------------------------------------------------------------
    def add_options(self, groups: OptionGroups, default: Callable[[str], Any]) -> None:
        data, model = groups.data, groups.model
        add_row_key_options(data, default)
        add_eval_data_option(data, default)
        add_negatives_option(data, default, "the built-in shapes have none")
        data.add_argument("--query-image-key", default=default("query_image_key"),
                          help="column (field) of each query's image: a path, a list of paths or image bytes")
        data.add_argument("--positive-image-key", default=default("positive_image_key"),
                          help="column (field) of each positive passage's image(s)")
        data.add_argument("--negative-image-keys", nargs="*", default=default("negative_image_keys"),
                          help="columns of the hard negatives' images, in --negative-keys' order, or one field "
                          "holding a list (default: the field negative_images where the rows have it)")
        data.add_argument("--image-root", default=default("image_root"),
                          help="the folder image paths are resolved under; a path may not leave it (default: the "
                          "data file's folder)")
        model.add_argument("--model", default=default("model"), help="a local Hugging Face VLM folder of the "
                           f"{FAMILIES} families with its processor (loaded offline), a SentenceTransformer folder "
                           f"holding one, or a preset built from a config with random weights: "
                           f"{', '.join(VISION_LANGUAGE_PRESETS)}")
        model.add_argument("--pooling", default=default("pooling"), choices=list(VLM_POOLINGS),
                           help="the embedding: the last hidden state at each input's last token (the end token "
                           "appended; decoder embedders) or its mean over the input's tokens")
        add_prompt_options(model, default)
        add_max_length_option(model, default, "input, its image tokens included (an input longer is refused, "
                              "never truncated into its image tokens)")
        model.add_argument("--max-pixels", type=int, default=default("max_pixels"),
                           help="each image resized, aspect kept, to at most this many pixels by the model's "
                           "processor (default: the processor's own budget)")
        model.add_argument("--train-vision", action="store_true", help="train the vision tower too (default: "
                           "frozen, run once per step and its outputs reused by GradCache's second pass)")
        add_lora_options(model, default)
        add_chunking_options(groups.run, default, "rows x the chunk's padded length, image tokens included")

    def check(self, config: RunConfig) -> None:
        """The LoRA options (modes/lora.py) and the prompts; `--train-vision` apart from `--lora-rank`, which adapts
        the language model alone. Every placement takes either: over several processes the tower runs in every
        forward (`build_encoder`)."""
        check_lora_options(config)
        check_prompts(config)
        if config.train_vision and config.lora_rank is not None:
            raise UsageError(f"--train-vision with --lora-rank {config.lora_rank}: LoRA adapts the language model "
                             "alone and keeps every other weight frozen; drop --train-vision to train the adapter, or "
                             "--lora-rank to train every weight, the vision tower's included")

    def check_model(self, config: RunConfig) -> None:
        """`--model` is a preset or a VLM folder of a family read here with its processor (config.json alone), and
        every `--lora-targets` name is a leaf name of a linear layer of its language model (its shapes built on the
        meta device)."""
        check_vision_language_model("--model", config.model)
        settings = lora_settings(config)
        if settings is None or settings.targets is None:
            return
        with torch.device("meta"):
            skeleton = _skeleton(config)
        leaves = sorted({name.rsplit(".", 1)[-1] for name in language_model_lora_targets(skeleton.model)})
        unknown = [target for target in settings.targets if target not in leaves]
        if unknown:
            raise UsageError(f"--lora-targets {','.join(settings.targets)}: {', '.join(map(repr, unknown))} names no "
                             f"linear layer of the language model of --model {config.model} (LoRA never adapts the "
                             f"vision tower); its layers are named {', '.join(leaves)}")

    def embedding_width(self, config: RunConfig) -> int:
        """The language model's hidden size: the preset's, or the folder's config.json's (nothing built)."""
        if is_preset(config.model):
            return VISION_LANGUAGE_PRESETS[config.model].hidden_size
        import transformers

        path = model_path(config.model)
        return transformers.AutoConfig.from_pretrained(path, local_files_only=True).get_text_config().hidden_size

    # --- data -------------------------------------------------------------------------------------------
    def load_data(self, config: RunConfig) -> VisionLanguageSplits:
        return load_vision_language_splits(config)

    def collator(self, config: RunConfig, max_length: int | None = None) -> VisionLanguageCollator:
        """`--model`'s processor as a collator: left padding, `--max-pixels`, `--max-length` (or `max_length`), the
        prompts."""
        return VisionLanguageCollator(processor(config), max_pixels=config.max_pixels,
                                      max_length=max_length or config.max_length,
                                      query_prompt=config.query_prompt or "",
                                      passage_prompt=config.passage_prompt or "", padding_side="left")

    def batches(self, config: RunConfig, data: VisionLanguageSplits, sampler: StepSampler) -> DataLoader:
        return vision_language_batches(config, data, sampler, self.collator(config))

    def resolve(self, config: RunConfig, data: VisionLanguageSplits) -> RunConfig:
        """h as the data has it; the inputs' lengths checked against `--max-length` from a sample of the rows; a
        LoRA run's base folder fingerprinted when it starts and compared when it resumes."""
        config = dataclasses.replace(config, negatives_per_query=data.negatives_per_query)
        check_vision_language_lengths(config, data, self.collator(config))
        if config.lora_rank is not None and not is_preset(config.model):
            return with_base_fingerprint(config, model_path(config.model))
        return config

    def hard_negatives(self, config: RunConfig) -> int:
        return config.negatives_per_query or 0

    def chunk_sizes(self, config: RunConfig) -> tuple[int, int]:
        """c queries and their c (1 + h) passages per chunk."""
        return config.chunk_size, config.chunk_size * (1 + self.hard_negatives(config))

    # --- model and loss ---------------------------------------------------------------------------------
    def build_model(self, config: RunConfig) -> VisionLanguageEncoder:
        """The embedder; with `--lora-rank` its model wrapped by peft on the language model's layers alone."""
        encoder = build_encoder(config)
        settings = lora_settings(config)
        if settings is not None:
            if config.base_fingerprint is not None:  # the base the run started from, before it is trained on
                check_fingerprint(config.base_fingerprint, model_path(config.model), "--model", config.fingerprint)
            encoder.model = wrap_lora(encoder.model, settings, lora_targets(encoder, settings))
            encoder.train(encoder.training)
        return encoder

    def initialise(self, config: RunConfig, model: nn.Module, loss: nn.Module) -> None:
        """A new LoRA run says what it adapts, once (rank 0)."""
        settings = lora_settings(config)
        if settings is not None and distributed.rank() == 0:
            leaves, source = lora_leaves(model.model.get_base_model(), settings)
            shown = "all-linear" if leaves is None else ", ".join(leaves)
            print(f"gradcache train: {lora_line(model, settings, shown, source)}", file=sys.stderr)

    def build_loss(self, config: RunConfig) -> nn.Module:
        return GroupedInfoNCE(self.hard_negatives(config), config.temperature, tile_size=config.tile_size,
                              queue_size=config.queue_size, queue_warmup=config.queue_warmup)

    def matryoshka(self, loss: nn.Module, dims: list[int]) -> nn.Module:
        return grouped_matryoshka(loss, dims)

    def encoders(self, model: nn.Module, guide: nn.Module | None = None) -> nn.Module:
        return model  # one embedder for queries and passages

    def reused_modules(self, config: RunConfig, model: nn.Module) -> list[nn.Module]:
        """The frozen vision tower (none with `--train-vision`): GradCache keeps its outputs from phase (1)."""
        return [] if config.train_vision else [model.vision_tower]

    # --- evaluation -------------------------------------------------------------------------------------
    def metrics(self, config: RunConfig, model: nn.Module, data: VisionLanguageSplits,
                device: torch.device) -> dict[str, float]:
        embed = vision_language_embedder(model, self.collator(config), device, EMBED_BATCH)
        return evaluate_vision_language_retrieval(embed, data.test, data.image_root)

    def baselines(self, config: RunConfig, data: VisionLanguageSplits, initial: dict[str, float]) -> dict[str, float]:
        """The model at step 0: `<metric>_random_init` for a preset (random weights), `<metric>_initial` for a
        pretrained folder."""
        suffix = "_random_init" if is_preset(config.model) else "_initial"
        return {f"{key}{suffix}": value for key, value in initial.items()}

    # --- in use: gradcache encode -----------------------------------------------------------------------
    @property
    def model_noun(self) -> str:
        return "a vision-language model"

    def loaded_from_run(self, request: ModelRequest, run: Path, config: RunConfig, model: nn.Module,
                        meta, source: str) -> LoadedModel:
        """The run's embedder with `--model`'s processor at the run's `--max-length` (or the request's), its
        `--max-pixels` and prompts."""
        embed = vision_language_embedder(model, self.collator(config, request.max_length), request.device,
                                         EMBED_BATCH)
        return LoadedModel(self, source, model, request.device, embed_inputs=embed, config=config, meta=meta,
                           query_prompt=config.query_prompt, passage_prompt=config.passage_prompt)

    def reads_folder(self, found: ModelFolderFormat | None, folder: Path) -> bool:
        """A Hugging Face VLM folder or a SentenceTransformer folder holding one (models/vision_language_folder.py):
        asked before the text kinds, which would read either format."""
        return found in (ModelFolderFormat.HUGGING_FACE, ModelFolderFormat.SENTENCE_TRANSFORMERS) \
            and is_vision_language_folder(folder)

    def load_folder(self, request: ModelRequest, folder: Path, found: ModelFolderFormat | None) -> LoadedModel:
        """The folder's embedder with its processor, pooling, pixel budget and prompts (the request's prompts and
        `--max-length` where given)."""
        try:
            read = read_vision_language_folder(folder)
        except (ValueError, OSError) as error:
            raise UsageError(f"MODEL {request.name}: {error}") from error
        query_prompt, passage_prompt = request.prompts_or(read.query_prompt, read.passage_prompt)
        collator = VisionLanguageCollator(read.processor, max_pixels=read.max_pixels,
                                          max_length=request.max_length or read.max_length,
                                          query_prompt=query_prompt or "", passage_prompt=passage_prompt or "",
                                          padding_side="left")
        encoder = read.encoder.to(request.device).eval()
        embed = vision_language_embedder(encoder, collator, request.device, EMBED_BATCH)
        return LoadedModel(self, f"model folder {folder}", encoder, request.device, embed_inputs=embed,
                           query_prompt=query_prompt, passage_prompt=passage_prompt)

    # --- export -----------------------------------------------------------------------------------------
    def card_settings(self) -> tuple[str, ...]:
        return ("pooling", "train_vision", "max_pixels", "query_prompt", "passage_prompt")

    def export(self, config: RunConfig, model: nn.Module, loss: nn.Module, folder: Path) -> None:
        """A SentenceTransformer folder of the embedder and its processor; with `--lora-rank` the model merged with
        its adapter, and the adapter in `adapter/` (export/vision_language.py)."""
        write_vision_language_folder(model, processor(config), folder, base=config.model,
                                     max_length=config.max_length, max_pixels=config.max_pixels,
                                     query_prompt=config.query_prompt, passage_prompt=config.passage_prompt)


def lora_leaves(model: nn.Module, settings: LoraSettings) -> tuple[tuple[str, ...] | None, str]:
    """The leaf names of the language model's layers `settings` adapt in the VLM `model` (unwrapped), and why
    those: `--lora-targets`, else peft's default for the language model's type (Llama: q_proj, v_proj; Qwen2-VL's
    read as Qwen2's), else None: every linear layer of the language model."""
    if settings.targets is not None:
        return tuple(settings.targets), "given"
    text_type = getattr(model.config.get_text_config(), "model_type", None) or ""
    for model_type in (text_type, text_type.removesuffix("_text"),
                       text_type.removesuffix("_text").removesuffix("_vl")):  # qwen2_vl_text -> qwen2_vl -> qwen2
        defaults = peft_default_targets(model_type)
        if defaults is not None:
            return tuple(defaults), f"peft's default for {model_type}, in the language model"
    return None, f"every Linear layer of the language model: peft has no default for {text_type}"


def lora_targets(encoder: VisionLanguageEncoder, settings: LoraSettings) -> list[str]:
    """The layers of `encoder`'s language model that `settings` adapt (`lora_leaves`), named as peft matches them
    in `encoder.model`: never a layer of the vision tower or its merger (`language_model_lora_targets`).

    Raises:
        ValueError: no layer of the language model has one of the leaf names.
    """
    leaves, _ = lora_leaves(encoder.model, settings)
    return language_model_lora_targets(encoder.model, leaves)


def _skeleton(config: RunConfig) -> VisionLanguageEncoder:
    """`--model`'s embedder with its shapes alone (call under `torch.device("meta")`): a preset's built from its
    config, a folder's from its config.json."""
    if is_preset(config.model):
        model, _ = build_vision_language_model(config.model, ["a"])
        return VisionLanguageEncoder(model)
    import transformers

    model_config = transformers.AutoConfig.from_pretrained(model_path(config.model), local_files_only=True)
    return VisionLanguageEncoder(transformers.AutoModel.from_config(model_config))
