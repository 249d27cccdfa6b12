"""The run configuration: every option of `gradcache train`, typed, in one dataclass stored in each checkpoint.

A field's default here is the option's default; a mode (gradcache/train/modes/) overrides a few of them
(`Mode.defaults`) and declares which mode-only fields it reads. `to_dict` is what a checkpoint stores and
`RunConfig.from_dict` reads it back, version by version: what an older checkpoint lacks is filled in by
`_upgrade`, explicitly, with the value that reproduces the run that wrote it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from gradcache.train.errors import CheckpointError

CONFIG_VERSION = 7


@dataclass
class RunConfig:
    mode: str = "simclr"
    # data
    data: str = "shapes"  # 'shapes', 'digits', an ImageFolder root (simclr) or a CSV/TSV of pairs (clip)
    image_size: int = 32
    train_size: int = 8192  # built-in shapes only
    test_size: int = 2048
    data_seed: int = 0
    csv_image_key: str = "filepath"  # clip
    csv_caption_key: str = "title"  # clip
    csv_separator: str | None = None  # clip; None: tab for .tsv, else comma
    crop_min_scale: float = 0.5  # simclr views
    jitter_strength: float = 0.5  # simclr views
    channel_permutation: float = 0.5  # simclr views
    rotation: float = 0.0  # simclr views
    workers: int = 1
    max_bad_share: float = 0.05  # more images or rows than this share unreadable: the run stops (DATA_ERROR)
    threads: int | None = None  # None: CPU cores minus workers, at least 1
    # model
    model: str = "convnet"  # a name of gradcache.models.IMAGE_ENCODER_PRESETS, or (clip) open_clip:ARCH
    pretrained: str | None = None  # clip with open_clip:ARCH: a local checkpoint file loaded on a fresh run
    width: int = 16
    norm: str = "group"
    projection_dim: int = 128
    hidden_dim: int = 512  # simclr projection head
    context_length: int = 96  # clip text tower
    text_width: int = 128
    text_layers: int = 2
    text_heads: int = 4
    grad_checkpointing: bool = False
    pooling: str | None = None  # text; None: the model folder's own (sentence-transformers), else mean
    max_length: int = 128  # text: most tokens per query or passage
    separate_towers: bool = False  # text: a query and a passage encoder instead of one shared
    query_key: str = "query"  # text
    positive_key: str = "positive"  # text
    negative_keys: list[str] | None = None  # text: columns (or one list-valued JSONL field) of hard negatives
    negatives_per_query: int | None = None  # text: h; None: what most rows of --data have (built-in world: 1)
    symmetric: bool = False  # text: InfoNCE in both directions
    # optimisation
    strategy: str = "gradcache"
    batch_size: int = 128  # global, over every rank
    chunk_size: int = 32
    tile_size: int | None = None
    queue_size: int = 0  # past embeddings kept as extra negatives (the loss's queue_size); 0: none
    queue_warmup: int = 0  # steps (micro-batches under naive) before the queue is read or filled
    memory_budget: int | None = None  # text: bytes of autograd graphs GradCache keeps (None: re-encode every chunk)
    chunk_tokens: int | None = None  # text: GradCache chunks of at most this many padded tokens (None: fixed chunks)
    epochs: int | None = None  # None with steps None: the mode's default_epochs
    steps: int | None = None
    optimizer: str = "adamw"
    lr: float = 2e-3
    lr_scaling: str = "sqrt"
    base_batch_size: int = 256
    warmup: int = 10
    weight_decay: float = 1e-4
    momentum: float = 0.9
    temperature: float = 0.1
    max_logit_scale: float = 100.0  # clip
    precision: str = "fp32"
    device: str = "cpu"
    fsdp: bool = False
    fsdp_reduce: str = "chunk"
    cpu_offload: bool = False
    seed: int = 0
    collective_timeout: float = 1800.0  # seconds a collective may wait for a peer rank (torchrun runs)
    # output
    output_dir: str | None = None
    resume: str | None = None
    checkpoint_every: int = 100
    eval_every: int = 0
    knn_k: int = 200
    knn_temperature: float = 0.1
    quiet: bool = False

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

    def model_signature(self) -> dict[str, Any]:
        """The fields that fix the shapes of the parameters: a checkpoint resumes only into the same ones."""
        return {key: getattr(self, key) for key in MODEL_FIELDS}


MODEL_FIELDS = ("mode", "model", "width", "norm", "image_size", "hidden_dim", "projection_dim", "context_length",
                "text_width", "text_layers", "text_heads", "separate_towers")

# Version 1 stored the argparse namespace of one mode: the other mode's options were absent, and so were the
# options added after it. Each takes the value under which that run trained.
_V1_ABSENT = {
    "simclr": dict(csv_image_key="filepath", csv_caption_key="title", csv_separator=None, context_length=96,
                   text_width=128, text_layers=2, text_heads=4, max_logit_scale=100.0),
    "clip": dict(crop_min_scale=0.5, jitter_strength=0.5, channel_permutation=0.5, rotation=0.0, hidden_dim=512),
}
_V1_ADDED_LATER = dict(rotation=0.0, fsdp=False, fsdp_reduce="chunk", cpu_offload=False)
# Version 3 added the text mode's options (image runs never read them) and clip's --pretrained.
_V3_ADDED = dict(pooling=None, max_length=128, separate_towers=False, query_key="query", positive_key="positive",
                 negative_keys=None, negatives_per_query=None, symmetric=False, pretrained=None)
# Version 4 added the queue of past embeddings; older runs trained without one.
_V4_ADDED = dict(queue_size=0, queue_warmup=0)
# Version 5 added --collective-timeout (run-local: a resume may give another).
_V5_ADDED = dict(collective_timeout=1800.0)
# Version 6 added --max-bad-share; the runs before it trained on whatever share of their data decoded.
_V6_ADDED = dict(max_bad_share=1.0)
# Version 7 added the text mode's chunking options (memory_budget and chunk_tokens): off before.
_V7_ADDED = dict(memory_budget=None, chunk_tokens=None)


def _upgrade(values: dict[str, Any]) -> dict[str, Any]:
    version = values.pop("config_version", 1)
    if version > CONFIG_VERSION:
        raise CheckpointError(f"the checkpoint was written by a newer gradcache (run options version {version}; "
                              f"this one reads up to {CONFIG_VERSION}); upgrade gradcache to read it")
    if version == 1:
        values.pop("subcommand", None)  # argparse's own entry, not an option
        values = {**_V1_ADDED_LATER, **_V1_ABSENT.get(values.get("mode"), {}), **values}
    if version < 3:
        values = {**_V3_ADDED, **values}
    if version < 4:
        values = {**_V4_ADDED, **values}
    if version < 5:
        values = {**_V5_ADDED, **values}
    if version < 6:
        values = {**_V6_ADDED, **values}
    if version < 7:
        values = {**_V7_ADDED, **values}
    return values
