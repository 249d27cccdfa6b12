"""The sizes of each section: GPU sizes, which the plan keeps under 8 minutes and inside 80 GB on one GPU, and
smoke sizes, the same code in seconds on a CPU."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TowerSize:
    """Two token towers (queries, passages) of `width`, `heads` attention heads, on `n` rows of `length` tokens
    each side, chunks of `chunk` rows."""

    n: int
    chunk: int
    length: int
    width: int
    heads: int = 4
    vocab: int = 1000
    out: int = 128


@dataclass(frozen=True)
class DecoderSize:
    """A random Llama of `hidden` x `layers`, LoRA of `rank`; `n` rows a side of up to `length` tokens."""

    hidden: int
    layers: int
    heads: int
    n: int
    chunk: int
    chunk_tokens: int
    length: int
    rank: int = 8
    vocab: int = 512


@dataclass(frozen=True)
class VlmSize:
    """A random Qwen2-VL: language model `hidden` x `layers` (`heads`, `kv_heads`, MLP `intermediate`), vision
    tower `vision_width` x `vision_depth` (`vision_heads`), LoRA of `rank` on the language model; `n` rows a side
    (text of `text_tokens`, square images of `image_side` pixels), chunks of at most `chunk_tokens` tokens and
    `chunk` rows."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vision_width: int
    vision_depth: int
    vision_heads: int
    n: int
    chunk: int
    chunk_tokens: int
    image_side: int
    text_tokens: int
    rank: int = 16
    vocab: int = 151936


@dataclass(frozen=True)
class Sizes:
    name: str
    replay: TowerSize
    memory: TowerSize
    speed: TowerSize
    speed_rounds: int
    tiled_check: int  # N of the tiled ClipLoss against the dense one
    tiled_step: int  # N of one tiled step alone
    tiled_dim: int
    tiled_tile: int
    lora: DecoderSize
    lora_rounds: int
    program_scale: int  # the program runs' batch, in multiples of the tests' tiny runs
    vlm: VlmSize


GPU = Sizes(
    name="gpu",
    replay=TowerSize(n=512, chunk=64, length=128, width=256),
    memory=TowerSize(n=16384, chunk=512, length=48, width=256),  # full batch: about 50 GB by the plan
    speed=TowerSize(n=4096, chunk=256, length=128, width=512),
    speed_rounds=5,
    tiled_check=16384,
    tiled_step=1_048_576,
    tiled_dim=512,
    tiled_tile=8192,
    lora=DecoderSize(hidden=1024, layers=8, heads=8, n=512, chunk=64, chunk_tokens=8192, length=256),
    lora_rounds=3,
    program_scale=4,
    vlm=VlmSize(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vision_width=1280,
                vision_depth=32, vision_heads=16, n=64, chunk=16, chunk_tokens=16384, image_side=448,
                text_tokens=32),  # Qwen2-VL-2B's shape; 1,024 patches (256 tokens) an image
)

SMOKE = Sizes(
    name="smoke",
    replay=TowerSize(n=12, chunk=4, length=12, width=16, vocab=100, out=8),
    memory=TowerSize(n=16, chunk=4, length=8, width=16, vocab=100, out=8),
    speed=TowerSize(n=16, chunk=4, length=8, width=16, vocab=100, out=8),
    speed_rounds=2,
    tiled_check=64,
    tiled_step=256,
    tiled_dim=16,
    tiled_tile=32,
    lora=DecoderSize(hidden=32, layers=1, heads=4, n=6, chunk=2, chunk_tokens=24, length=12, rank=2, vocab=64),
    lora_rounds=1,
    program_scale=1,
    vlm=VlmSize(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, vision_width=32, vision_depth=1,
                vision_heads=2, n=6, chunk=2, chunk_tokens=64, image_side=56, text_tokens=4, rank=2, vocab=64),
)

SIZES = {sizes.name: sizes for sizes in (GPU, SMOKE)}
