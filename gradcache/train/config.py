"""The run configuration: every option of `gradcache train`, typed, in one dataclass stored in each checkpoint.

A field's default here is the option's default; a mode (gradcache/train/modes/) overrides a few of them
(`Mode.defaults`). What else there is to know of a field is said once, in its `option(...)` metadata:
- `modes`: the modes that read it (none: every mode);
- `model`: it fixes the shapes of the parameters, so a checkpoint resumes only into the same value;
- `at_least`, `above`, `at_most`, `below`, `why`: its valid range and the reason, checked before a run writes
  anything (gradcache/train/preflight.py); an option the library checks (a loss's, a strategy's) has no range here,
  and a value whose memory depends on other options (`--image-size`, `--queue-size`) is bounded by the memory
  there is, in preflight.py (`check_memory`);
- `path`: it names a file or folder, stored absolute;
- `run_local`: a resume may give it anew (gradcache/train/checkpoints/resume.py); `kept_unless_given`: a resume
  that does not give it keeps the run's value instead of the default;
- `added`, `before`: the configuration version that added it and the value under which older runs trained.
`to_dict` is what a checkpoint stores and `RunConfig.from_dict` reads any version back. A new option: one field
here (with `added=CONFIG_VERSION + 1` and a bump of CONFIG_VERSION when older checkpoints lack it), its flag in
train_options.py or its mode's `add_options`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from gradcache.train.errors import CheckpointError

CONFIG_VERSION = 19
_SAME = object()  # `before` of a field whose older runs trained under its default


def option(default: Any, *, modes: tuple[str, ...] = (), model: bool = False, at_least: float | None = None,
           above: float | None = None, at_most: float | None = None, below: float | None = None, why: str = "",
           path: bool = False, run_local: bool = False, kept_unless_given: bool = False, added: int = 1,
           before: Any = _SAME) -> Any:
    """A RunConfig field: its default and what the module docstring lists, as metadata."""
    return dataclasses.field(default=default, metadata=dict(
        modes=modes, model=model, at_least=at_least, above=above, at_most=at_most, below=below, why=why, path=path,
        run_local=run_local or kept_unless_given, kept_unless_given=kept_unless_given, added=added, before=before))


SIMCLR, CLIP, TEXT, VLM, IMAGES = ("simclr",), ("clip",), ("text",), ("vlm",), ("simclr", "clip")
ROWS = TEXT + VLM  # the modes that train on rows of queries and passages (their keys, prompts, LoRA)


@dataclass
class RunConfig:
    mode: str = option("simclr", model=True)
    # data
    data: str = option("shapes", path=True)  # a built-in name ('shapes', 'digits', 'world', ...) or a path in the mode's format
    image_size: int = option(32, modes=IMAGES, model=True, at_least=1)
    train_size: int = option(8192, at_least=1)  # built-in data only
    test_size: int | None = option(None, at_least=1)  # None: data/held_out.py's default (a tenth, at most a cap)
    data_seed: int = 0
    csv_image_key: str = option("filepath", modes=CLIP)
    csv_caption_key: str = option("title", modes=CLIP)
    csv_separator: str | None = option(None, modes=CLIP)  # None: tab for .tsv, else comma
    crop_min_scale: float = option(0.5, modes=SIMCLR, above=0, at_most=1)  # views
    jitter_strength: float = option(0.5, modes=SIMCLR, at_least=0, at_most=2.5, why="hue shift 0.2 s at most 0.5")
    channel_permutation: float = option(0.5, modes=SIMCLR, at_least=0, at_most=1, why="a probability")
    rotation: float = option(0.0, modes=SIMCLR, added=2)
    # a resume keeps the run's --workers unless given: the order of streamed data (webdataset shards, .jsonl.gz)
    # depends on the worker count, so a resume that forgot it would not continue the same batches
    workers: int = option(1, at_least=0, kept_unless_given=True)
    max_bad_share: float = option(0.05, at_least=0, at_most=1, why="a share of the data", added=6,
                                  before=1.0)  # older runs trained on whatever share decoded
    eval_data: str | None = option(None, added=9, path=True)  # a held-out set apart; None: --test-size of --data
    eval_reference_size: int | None = option(2048, modes=SIMCLR, at_least=1, added=9, before=None)  # None: all
    shuffle_buffer: int = option(1000, at_least=1, added=9)  # tar shards, .jsonl.gz: items per worker buffer
    train_num_samples: int | None = option(None, at_least=1, added=9)  # tar shards, .jsonl.gz; None: counted
    threads: int | None = option(None, at_least=1, run_local=True)  # None: CPU cores minus workers, at least 1
    # model
    model: str = option("convnet", model=True, path=True)  # an image preset, open_clip:ARCH (clip) or a model folder (text)
    pretrained: str | None = option(None, modes=CLIP, added=3, path=True)  # with open_clip:ARCH: weights of a new run
    width: int = option(16, modes=IMAGES, model=True, at_least=1)
    norm: str = option("group", modes=IMAGES, model=True)
    projection_dim: int = option(128, modes=IMAGES, model=True, at_least=1)
    hidden_dim: int = option(512, modes=SIMCLR, model=True, at_least=1)  # projection head
    context_length: int = option(96, modes=CLIP, model=True, at_least=3,
                                 why="a start token, one byte and an end token")  # text tower
    text_width: int = option(128, modes=CLIP, model=True, at_least=1)
    text_layers: int = option(2, modes=CLIP, model=True, at_least=1)
    text_heads: int = option(4, modes=CLIP, model=True, at_least=1)
    grad_checkpointing: bool = False
    pooling: str | None = option(None, modes=ROWS, added=3)  # None: the folder's own (sentence-transformers), else mean
    max_length: int = option(128, modes=ROWS, at_least=2, why="two special tokens", added=3)  # most tokens per text
    separate_towers: bool = option(False, modes=TEXT, model=True, added=3)  # a query and a passage encoder
    query_key: str = option("query", modes=ROWS, added=3)
    positive_key: str = option("positive", modes=ROWS, added=3)
    negative_keys: list[str] | None = option(None, modes=ROWS, added=3)  # columns, or one list-valued JSONL field
    negatives_per_query: int | None = option(None, modes=ROWS, at_least=0, added=3)  # h; None: what most rows have
    corpus: str | None = option(None, modes=TEXT, added=9, path=True)  # (id, text) passages that rows name by id
    symmetric: bool = option(False, modes=TEXT, added=3)  # InfoNCE in both directions
    guide: str | None = option(None, modes=TEXT, added=8, path=True)  # a frozen model whose similarities mask false negatives
    guide_margin: float = option(0.0, modes=TEXT, added=8)
    guide_margin_strategy: str = option("absolute", modes=TEXT, added=8)  # or "relative"
    # LoRA adapters (modes/lora.py); None rank: every weight trained; None alpha, dropout, targets: their defaults there
    lora_rank: int | None = option(None, modes=ROWS, model=True, at_least=1, added=11)
    lora_alpha: float | None = option(None, modes=ROWS, above=0, added=11)
    lora_dropout: float | None = option(None, modes=ROWS, at_least=0, below=1, why="a probability of dropping",
                                        added=11)
    lora_targets: list[str] | None = option(None, modes=ROWS, model=True, added=11)  # module names, as peft matches
    # the base model folder's fingerprint when a LoRA run started, compared whenever its model is rebuilt
    base_fingerprint: dict | None = option(None, modes=ROWS, added=17)  # modes/base_fingerprint.py
    # how it hashes the weight files: "sampled" (64 blocks of a large file) or "full"; runs of version 17
    # fingerprinted config.json and the weights alone ("weights"), not the tokenizer
    fingerprint: str = option("sampled", modes=ROWS, added=18, before="weights")
    # the kind of model text trains (modes/__init__.py's TEXT_KINDS): dense vectors, token vectors (late
    # interaction), sparse vocabulary rows (SPLADE), or a cross-encoder scoring each (query, passage) pair
    kind: str = option("dense", modes=TEXT, model=True, added=14)
    # --kind sparse: SPLADE's FLOPS weights lambda_d, lambda_q (sentence-transformers' SpladeLoss examples' values)
    document_regularizer_weight: float = option(3e-5, modes=TEXT, at_least=0, why="it weighs a penalty", added=14)
    query_regularizer_weight: float = option(5e-5, modes=TEXT, at_least=0, why="it weighs a penalty", added=14)
    # --kind multi-vector: D per token, at most models/multi_vector.py's MAX_TOKEN_DIM (a mistyped 2e9 would allocate
    # a (2e9, hidden) projection)
    token_dim: int = option(128, modes=TEXT, model=True, at_least=1, at_most=65536, why="ColBERT uses 128", added=14)
    # --kind multi-vector: ColBERT's query expansion (models/query_expansion.py): every query this many tokens, the
    # padding replaced by [MASK] and scored, and attended too with attend_to_expansion; None: off (or --model's own)
    query_expansion: int | None = option(None, modes=TEXT, at_least=2, why="two special tokens", added=15)
    attend_to_expansion: bool = option(False, modes=TEXT, added=15)
    in_batch_negatives: int = option(4, modes=TEXT, at_least=0, added=14)  # --kind cross-encoder: per query, per step
    # decoder embedders and prompts: texts prepended to queries and to passages (sentence-transformers' prompts)
    query_prompt: str | None = option(None, modes=ROWS, added=12)
    passage_prompt: str | None = option(None, modes=ROWS, added=12)
    exclude_prompt_from_pooling: bool = option(False, modes=TEXT, added=12)  # False: the folder's own, else included
    # vision-language rows (gradcache train vlm): each side's images beside its text, paths under --image-root (None:
    # the data file's folder); None negative image keys: the field `negative_images` where the rows have it
    query_image_key: str = option("query_image", modes=VLM, added=19)
    positive_image_key: str = option("positive_image", modes=VLM, added=19)
    negative_image_keys: list[str] | None = option(None, modes=VLM, added=19)
    image_root: str | None = option(None, modes=VLM, path=True, added=19)
    max_pixels: int | None = option(None, modes=VLM, at_least=1, added=19)  # per image; None: the processor's own
    train_vision: bool = option(False, modes=VLM, model=True, added=19)  # False: the vision tower frozen, run once
    # optimisation
    strategy: str = "gradcache"
    batch_size: int = option(128, at_least=2, why="a contrastive batch needs at least 2 examples")  # over every rank
    chunk_size: int = option(32, at_least=1)
    tile_size: int | None = None  # checked by the loss
    queue_size: int = option(0, added=4)  # past embeddings kept as extra negatives (the loss's queue_size)
    queue_warmup: int = option(0, added=4)  # steps (micro-batches under naive) before the queue is used
    memory_budget: int | None = option(None, modes=ROWS, added=7)  # bytes of graphs GradCache keeps (checked there)
    chunk_tokens: int | None = option(None, modes=ROWS, added=7)  # chunks of at most this many padded tokens
    matryoshka_dims: list[int] | None = option(None, added=8)  # the loss also on these column prefixes (Matryoshka)
    epochs: int | None = option(None, at_least=1)  # None with steps None: the mode's default_epochs
    steps: int | None = option(None, at_least=1)
    optimizer: str = "adamw"
    lr: float = option(2e-3, above=0)
    lr_scaling: str = "sqrt"
    base_batch_size: int = option(256, at_least=1)
    warmup: int = option(10, at_least=0)
    weight_decay: float = option(1e-4, at_least=0)
    momentum: float = option(0.9, at_least=0, below=1, why="0.9 is usual")
    temperature: float = 0.1  # checked by the loss
    max_logit_scale: float = option(100.0, modes=CLIP, above=0)
    precision: str = "fp32"
    # torch.compile of the encoders (gradcache/train/compilation.py); a resume may turn it on or off
    compile: bool = option(False, run_local=True, added=16)
    compile_backend: str = option("inductor", run_local=True, added=16)  # checked in compilation.py
    device: str = option("cpu", run_local=True)
    fsdp: bool = option(False, added=2)
    fsdp_reduce: str = option("chunk", added=2)
    cpu_offload: bool = option(False, run_local=True, added=2)  # where the shards live: a resume may change it
    deepspeed: str | None = option(None, added=13, path=True)  # a DeepSpeed JSON config: ZeRO engine (parallel/deepspeed.py)
    # the --deepspeed file's contents when the run started, kept so a resume trains under them (parallel/deepspeed.py)
    deepspeed_settings: dict | None = option(None, added=17)
    # each sample's generator is seeded by about seed x 10^13 (data/order.py, data/streams.py): 64 bits hold that
    seed: int = option(0, at_least=-900_000, at_most=1_800_000, why="each sample's generator seed, about seed x "
                       "10^13, must fit in 64 bits")
    collective_timeout: float = option(1800.0, run_local=True, added=5)  # seconds a collective waits (torchrun)
    # output
    output_dir: str | None = option(None, run_local=True)
    resume: str | None = option(None, run_local=True)
    checkpoint_every: int = option(100, at_least=1, run_local=True)
    eval_every: int = option(0, at_least=0, run_local=True)
    knn_k: int = option(200, modes=IMAGES, at_least=1)
    knn_temperature: float = option(0.1, modes=IMAGES, above=0)
    quiet: bool = option(False, run_local=True)
    progress_every: float = option(30.0, at_least=0, run_local=True, added=10)  # seconds between progress lines
    # a resume keeps the run's --report-to unless given (`--report-to none` stops it): one that forgot it would
    # leave a gap in the run's TensorBoard folder
    report_to: list[str] | None = option(None, kept_unless_given=True, added=8)  # run_folder/reporters.py; None: CSV

    def to_dict(self) -> dict[str, Any]:
        """Plain values, with the version `from_dict` reads them by."""
        return {**asdict(self), "config_version": CONFIG_VERSION}

    @classmethod
    def from_dict(cls, stored: dict[str, Any]) -> RunConfig:
        """The configuration a checkpoint stored, of this or any older version.

        Raises:
            CheckpointError: a newer version than this program reads, or fields that no version explains.
        """
        values = _upgrade(dict(stored))
        names = {f.name for f in fields(cls)}
        missing = sorted(names - set(values))
        if missing:
            raise CheckpointError(f"the checkpoint's run options lack {missing}; it was not written by gradcache train")
        return cls(**{name: values[name] for name in names})

    def total_steps(self, train_size: int) -> int:
        """`steps`, or `epochs` full passes over `train_size` images (partial last batches dropped)."""
        return self.steps if self.steps is not None else self.epochs * (train_size // self.batch_size)


def with_absolute_paths(config: RunConfig) -> RunConfig:
    """`config` with every `path=True` field that names an existing file or folder made absolute, so the run's
    stored options (its checkpoint, `gradcache eval RUN`, `--resume`) mean the same from any directory; a name
    that is not a path (a built-in data set, a model preset) stays as it is."""
    changes = {}
    for f in fields(RunConfig):
        value = getattr(config, f.name)
        if f.metadata.get("path") and isinstance(value, str) and value and Path(value).exists():
            changes[f.name] = str(Path(value).resolve())
    return dataclasses.replace(config, **changes)


MODEL_FIELDS = tuple(f.name for f in fields(RunConfig) if f.metadata.get("model"))
RUN_LOCAL = tuple(f.name for f in fields(RunConfig) if f.metadata.get("run_local"))
KEPT_UNLESS_GIVEN = tuple(f.name for f in fields(RunConfig) if f.metadata.get("kept_unless_given"))


def _upgrade(values: dict[str, Any]) -> dict[str, Any]:
    """Fill in what an older version did not store, with the value under which its run trained."""
    version = values.pop("config_version", 1)
    if version > CONFIG_VERSION:
        raise CheckpointError(f"the checkpoint was written by a newer gradcache (run options version {version}; "
                              f"this one reads up to {CONFIG_VERSION}); upgrade gradcache to read it")
    if version == 1:
        values.pop("subcommand", None)  # version 1 stored the argparse namespace of its mode: argparse's own entry,
    for f in fields(RunConfig):  # ... and only its own mode's options (the others trained at their defaults)
        if f.name in values:
            continue
        added, before = f.metadata.get("added", 1), f.metadata.get("before", _SAME)
        other_mode = version == 1 and f.metadata.get("modes") and values.get("mode") not in f.metadata["modes"]
        if version < added or other_mode:
            values[f.name] = f.default if before is _SAME else before
    return values
