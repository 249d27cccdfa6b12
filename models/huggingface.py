"""Any Hugging Face ``AutoModel`` as a text encoder: last hidden states pooled over the attention mask (the mean,
the first token, or each row's last non-padding token)."""

from __future__ import annotations

import inspect
import json
import os
import pickle
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gradcache.models.checkpointing import hugging_face_checkpointing
from gradcache.models.sentence_transformers_folder import read_sentence_transformer_folder

HF_POOLINGS = ("mean", "cls", "last")


def _load_local_model(path: str | os.PathLike) -> nn.Module:
    try:
        import transformers
    except ImportError as error:
        raise ImportError(
            'HuggingFaceEncoder needs the transformers package: pip install -e ".[hf]"'
        ) from error
    folder = os.fspath(path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"path_or_model={folder!r} is not a directory; give a local folder written by "
                                "save_pretrained (this project never downloads from a hub)")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise ValueError(f"path_or_model={folder!r} has no config.json, so it is not a Hugging Face model "
                         "folder; give the folder that save_pretrained wrote")
    check_weights(folder)
    # local_files_only: this project never downloads; a hub name that is not on disk fails here.
    try:
        return transformers.AutoModel.from_pretrained(folder, local_files_only=True)
    except pickle.UnpicklingError as error:  # torch.load(weights_only=True) met more than tensors: it could run code
        raise ValueError(f"the weights of {folder} (pytorch_model.bin) hold more than tensors, which could run "
                         "code, so they are not loaded; save the model as model.safetensors") from error
    except (OSError, RuntimeError, EOFError) as error:
        raise ValueError(f"the model in {folder} does not load: {error}".splitlines()[0]) from error
    except Exception as error:  # safetensors' SafetensorError, which it does not export as a type of its own
        if type(error).__module__.startswith("safetensors"):
            raise ValueError(f"the weights in {folder} do not load: {error}") from error
        raise


def check_weights(folder: str | os.PathLike) -> None:
    """The folder's weights against its config.json, before any is loaded: `model.safetensors` (or the shards its
    `model.safetensors.index.json` lists) from their headers and a model built on the meta device, so a tampered
    config with huge sizes is refused before anything of its size is allocated and a corrupt header is refused
    naming the file, as is a config value of the wrong type; `pytorch_model.bin` (or its shards) must hold tensors
    alone (ValueError)."""
    import transformers

    from gradcache.models.safetensors_header import tensor_shapes

    folder = os.fspath(folder)
    safetensors, pickles = _weight_files(folder)
    for path in pickles:
        _check_unpickles(path)
    if not safetensors:
        return
    found = {name: shape for path in safetensors for name, shape in tensor_shapes(path).items()}
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
        with torch.device("meta"):
            skeleton = transformers.AutoModel.from_config(config)
    except (OSError, ValueError, TypeError, KeyError, *config_validation_errors()) as error:
        cause = " ".join(str(error).split())  # a validation error spans lines: one line, for a one-line message
        raise ValueError(f"the config.json of {folder} does not build a model: {cause}") from error
    prefix = f"{getattr(skeleton, 'base_model_prefix', '')}."
    expected = {name: tuple(tensor.shape) for name, tensor in skeleton.state_dict().items()}
    differ = [f"{name}: {expected[name.removeprefix(prefix)]} in config.json, {shape} in the weights"
              for name, shape in found.items()
              if expected.get(name.removeprefix(prefix), shape) != shape]
    if differ:
        weights = safetensors[0] if len(safetensors) == 1 else f"{folder}'s {len(safetensors)} weight shards"
        raise ValueError(f"{weights} does not hold the model its config.json describes ({len(differ)} tensors "
                         f"differ, e.g. {'; '.join(differ[:3])}); the folder was edited or mixed: save it again")


def config_validation_errors() -> tuple[type[Exception], ...]:
    """What transformers raises for a config.json value of the wrong type (a string where a size belongs):
    huggingface_hub's StrictDataclassError, an Exception that is no ValueError; none where it has no such type."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)


# transformers' weight files, in the order it prefers them: one file, or shards named by an index's weight_map
_WEIGHTS = (("model.safetensors", "model.safetensors.index.json"), ("pytorch_model.bin", "pytorch_model.bin.index.json"))


def _weight_files(folder: str) -> tuple[list[str], list[str]]:
    """(safetensors files, pickled files) that transformers would load from `folder`: the single file, else the
    shards of its index. A shard named outside the folder (a path, `..`) is refused (ValueError)."""
    for kind, (single, index) in enumerate(_WEIGHTS):
        files = [os.path.join(folder, single)] if os.path.isfile(os.path.join(folder, single)) else []
        if not files and os.path.isfile(os.path.join(folder, index)):
            files = _shards(folder, os.path.join(folder, index))
        if files:
            return (files, []) if kind == 0 else ([], files)
    return [], []


def _shards(folder: str, index: str) -> list[str]:
    try:
        with open(index, encoding="utf-8") as handle:
            weight_map = json.load(handle)["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{index} is not a weight index (a JSON object whose weight_map maps tensor names to shard "
                         f"files): {error}; save the model again") from error
    for name in names:
        if not isinstance(name, str) or os.path.basename(name) != name or name in ("", ".", ".."):
            raise ValueError(f"{index} names the shard {name!r}, which is not a file of {folder}; a shard lies in "
                             "the folder beside its index")
    return [os.path.join(folder, name) for name in names]


def _check_unpickles(path: str) -> None:
    """A `pytorch_model.bin` at `path`, if there is one, holds tensors alone (torch.load's weights-only unpickler,
    as transformers loads it; memory-mapped where the file's format allows, so no tensor is read), else ValueError:
    one that would run code is refused before anything is written."""
    if not os.path.isfile(path):
        return
    try:
        try:
            torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # the legacy format, which cannot be memory-mapped
            torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise ValueError(f"{path} holds more than tensors, which could run code, so it is not loaded; save the "
                         "model as model.safetensors") from error
    except (RuntimeError, OSError, EOFError):
        return  # damaged rather than hostile: transformers' own load names it


def _drop_unused_pooler(model: nn.Module) -> None:
    """Remove the pooler (dense + tanh over the first token) that BERT-like models build and this wrapper never
    reads: its parameters would get no gradient, which DDP reports as an error and optimizers skip silently.
    Only for classes that take ``add_pooling_layer``: their forward accepts ``pooler = None``."""
    takes_flag = "add_pooling_layer" in inspect.signature(type(model).__init__).parameters
    if takes_flag and isinstance(getattr(model, "pooler", None), nn.Module):
        model.pooler = None


class HuggingFaceEncoder(nn.Module):
    """(input_ids (B, L), attention_mask (B, L), ...) -> pooled last hidden state (B, out_dim).

    ``"mean"`` averages the hidden states of the tokens whose mask is 1 (sentence-transformers'
    mean pooling); ``"cls"`` takes position 0; ``"last"`` takes each row's last token whose mask is 1, whichever
    side the padding is on (sentence-transformers' ``lasttoken``: decoder embedders such as E5-Mistral or
    Qwen3-Embedding, whose tokenizer appends the EOS token that is pooled; see ``HuggingFaceTokenizer``);
    ``normalize`` then divides by the L2 norm. Extra keyword arguments (``token_type_ids`` ...) go to the model
    unchanged.

    With ``include_prompt=False`` (mean pooling only, sentence-transformers' ``Pooling(include_prompt=False)``),
    the first ``prompt_length[b]`` non-padding tokens of row b (the prompt, its leading special token included, as
    ``HuggingFaceTokenizer`` counts it) are left out of the mean; they still pass through the model. Counted from
    each row's first non-padding token, so it holds for left and right padding and for any trimming of padding
    columns or regrouping of rows (``prompt_length`` is split with the rows).

    A sentence-transformers folder (one with ``modules.json``) is read as sentence-transformers reads it: the
    model from its ``Transformer`` module's path, the pooling from ``1_Pooling/config.json``, normalisation when
    it lists a ``Normalize`` module, so the embeddings equal ``SentenceTransformer(path).encode``'s.

    Like any ``nn.Module`` the wrapper starts in training mode, and ``train()`` / ``eval()`` govern the model
    inside it from construction on (``from_pretrained`` returns a model in eval mode: dropout would otherwise
    stay off while fine-tuning). The pooler of BERT-like models (``add_pooling_layer``) is removed, since the
    pooled output never uses it, so every parameter left receives a gradient.

    Args:
        path_or_model: a local directory saved by ``save_pretrained`` or by sentence-transformers (loaded with
            ``AutoModel.from_pretrained(..., local_files_only=True)``) or an already-built model whose
            output has ``last_hidden_state`` or whose first output is the hidden states.
        pooling: ``"mean"``, ``"cls"`` or ``"last"``; None: the folder's own pooling when it is a
            sentence-transformers folder (``lasttoken`` read as ``"last"``), else ``"mean"``.
        normalize: L2-normalise the pooled output; None: True exactly when the folder lists ``Normalize``.
        include_prompt: False: mean pooling leaves the prompt's tokens out (``forward``'s ``prompt_length``);
            None: the folder's ``1_Pooling/config.json`` ``include_prompt``, else True (sentence-transformers'
            default).

    Raises:
        ImportError: a path was given and ``transformers`` is not installed.
        FileNotFoundError: ``path_or_model`` is a path that is not a directory.
        ValueError: unknown ``pooling``; ``include_prompt=False`` with a pooling other than ``"mean"``; a folder
            without ``config.json``; a sentence-transformers folder whose modules cannot be applied.
        TypeError: ``path_or_model`` is neither a path nor an ``nn.Module``.

    Example:
        >>> encoder = HuggingFaceEncoder("/data/tiny-bert", pooling="mean")  # written by save_pretrained
        >>> features = encoder(input_ids, attention_mask)  # (B, encoder.out_dim)
        >>> decoder = HuggingFaceEncoder("/data/tiny-llama", pooling="last")  # LlamaForCausalLM: its base model
    """

    def __init__(self, path_or_model: str | os.PathLike | nn.Module, pooling: str | None = None,
                 normalize: bool | None = None, include_prompt: bool | None = None) -> None:
        super().__init__()
        if pooling is not None and pooling not in HF_POOLINGS:
            raise ValueError(f"pooling={pooling!r} is not supported; choose one of {HF_POOLINGS} or None.")
        if include_prompt is not None and not isinstance(include_prompt, bool):
            raise TypeError(f"include_prompt must be True, False or None, got {include_prompt!r}")
        if isinstance(path_or_model, (str, os.PathLike)):
            layout = read_sentence_transformer_folder(path_or_model)
            model = _load_local_model(path_or_model if layout is None else layout.model_path)
        elif isinstance(path_or_model, nn.Module):
            layout, model = None, path_or_model
        else:
            raise TypeError(
                f"path_or_model must be a local directory or an nn.Module, got {type(path_or_model).__name__}."
            )
        if pooling is None and layout is not None and layout.pooling is not None:
            pooling = layout.pooling
            if pooling not in HF_POOLINGS:
                raise ValueError(f"{path_or_model} pools by {pooling!r} (its 1_Pooling/config.json); this wrapper "
                                 f"computes {HF_POOLINGS}: pass pooling='mean', 'cls' or 'last' to override")
        self.pooling = pooling or "mean"
        if include_prompt is None:  # a folder's include_prompt=False changes mean pooling alone, as in ST
            include_prompt = layout is None or layout.include_prompt or self.pooling != "mean"
        if not include_prompt and self.pooling != "mean":
            raise ValueError(f"include_prompt=False leaves the prompt out of mean pooling; pooling={self.pooling!r} "
                             "reads one token, so the prompt's tokens are not in it: drop include_prompt=False, or "
                             "pool by 'mean'")
        _drop_unused_pooler(model)
        self.model = model
        self.include_prompt = include_prompt
        self.normalize = bool(layout.normalize if normalize is None and layout is not None else normalize)
        # The sequence length the folder's sentence-transformers model was trained with, when it says.
        self.max_seq_length = None if layout is None else layout.max_seq_length
        config = getattr(model, "config", None)
        self.out_dim = getattr(config, "hidden_size", None)
        self.train()  # the wrapper's mode is the model's from here on

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Use the model's own activation checkpointing (non-reentrant); active in training mode only."""
        hugging_face_checkpointing(self.model, enabled)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                prompt_length: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        """Pooled (B, out_dim). `prompt_length` (B,): the prompt's tokens per row, as ``HuggingFaceTokenizer``
        returns it with a prompt; read only by mean pooling with ``include_prompt=False``."""
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        hidden = outputs.last_hidden_state if hasattr(outputs, "last_hidden_state") else outputs[0]  # (B, L, H)
        if attention_mask is None:
            attention_mask = torch.ones(hidden.shape[:2], dtype=torch.long, device=hidden.device)  # (B, L)
        if self.pooling == "cls":
            pooled = hidden[:, 0]  # (B, H)
        elif self.pooling == "last":
            pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last_token(attention_mask)]  # (B, H)
        else:
            mask = attention_mask.ne(0)  # (B, L)
            if not self.include_prompt and prompt_length is not None:
                mask = mask & ~prompt_tokens(mask, prompt_length)
            weights = mask.to(hidden.dtype).unsqueeze(-1)  # (B, L, 1)
            # clamp: an all-padding row pools to zeros instead of 0 / 0.
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)  # (B, H)
        return F.normalize(pooled, dim=-1) if self.normalize else pooled


def last_token(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) mask -> (B,) the position of each row's last token whose mask is not 0 (0 for an all-padding row):
    the same token for left and right padding."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)  # (L,)
    return (attention_mask.ne(0) * positions).amax(dim=1)  # (B,)


def prompt_tokens(mask: torch.Tensor, prompt_length: torch.Tensor) -> torch.Tensor:
    """(B, L) boolean mask of real tokens, (B,) prompt lengths -> (B, L): True at the first prompt_length[b] real
    tokens of row b (counted from its first real token, so wherever the padding is)."""
    rank = mask.long().cumsum(dim=1) - 1  # (B, L) a real token's place among its row's real tokens
    return mask & (rank < prompt_length.to(rank.device).view(-1, 1))
