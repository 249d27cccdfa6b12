"""webdataset shards: `.tar` files of samples `KEY.jpg|.jpeg|.png|.webp` with, for CLIP, `KEY.txt` (the caption)
and optionally `KEY.cls` (an integer class in [0, MAX_SHARD_CLASSES): SimCLR's kNN evaluation needs it; CLIP never
reads it), read with the standard library's
`tarfile` (no extra dependency; a seekable tar's headers are read without its contents, which makes skipping
cheap, and a shard's members are read by offset only when a batch takes them).

What a run keeps in memory: per shard its path and sample count; per worker a shuffle buffer of at most
`--shuffle-buffer` member headers (not their bytes); the held-out and kNN reference images, decoded.

- Epoch length: `--train-num-samples`, or counted once at start from the shards' headers (one pass over the
  headers, no image read) and recorded in the run's options, so a resume does not count again.
- Held out: without `--eval-data`, the shards in a permutation seeded by `--data-seed` are taken from its head
  until they hold `--test-size` samples; the first `--test-size` samples of those shards, in that order, are the
  held-out set, and those shards are not trained on (the rest of the last one is left out, too).
- Order and resume: data/streams.py, each slot's stream of samples by their headers (a resume skips by headers
  only); a sample that fails to decode is found only when its batch is made, the case whose resume it names.
- Bad data: a member that fails to decode (in CLIP a sample without a caption, in SimCLR's held-out and
  reference samples a `.cls` that is not a class) is skipped and counted, and the next sample takes its place; a
  truncated shard is read up to its damage, counted once, and the stream goes on with the next shard. Both count
  in `skipped_images` and --max-bad-share (`BadShare`).
"""
from __future__ import annotations

import glob
import io
import re
import tarfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gradcache.train.data.images.lazy import DECODE_ERRORS, decode_image
from gradcache.train.data.images.sets import DataSplits, ImageSet
from gradcache.train.data.streams import SEED_STRIDE, Damaged, StreamBatches, stream_loader
from gradcache.train.errors import DataError

SHARD_IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
MAX_SHARD_CLASSES = 100_000  # a KEY.cls is a class in [0, MAX_SHARD_CLASSES); the kNN scores are (M, classes)
shard_loader = stream_loader  # the loader of `ShardBatches`


def is_shard_spec(spec: str) -> bool:
    """Whether `--data` names webdataset shards: a `.tar` file, a glob or brace pattern, or a folder of `.tar`
    files with no sub-folders (an ImageFolder has class sub-folders)."""
    path = Path(spec)
    if spec.endswith(".tar") or any(mark in spec for mark in "*?[{"):
        return True
    return path.is_dir() and any(path.glob("*.tar")) and not any(entry.is_dir() for entry in path.iterdir())


def expand_braces(pattern: str) -> list[str]:
    """'part-{000..002}.tar' -> part-000.tar, part-001.tar, part-002.tar (zero padding kept); '{a,b}' -> a, b."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    body, head, tail = match.group(1), pattern[:match.start()], pattern[match.end():]
    numbers = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if numbers:
        first, last = numbers.groups()
        width = len(first) if first.startswith("0") else 0
        choices = [str(n).zfill(width) for n in range(int(first), int(last) + 1)]
    else:
        choices = body.split(",")
    return [expanded for choice in choices for expanded in expand_braces(head + choice + tail)]


def find_shards(spec: str, flag: str = "--data") -> list[str]:
    """The shard files `spec` names (a .tar file, a folder of them, a glob or brace pattern), sorted.

    Raises:
        DataError: nothing matches, or a match is not a .tar file (mixed formats).
    """
    path = Path(spec)
    if path.is_dir():
        found = sorted(str(p) for p in path.glob("*.tar"))
    else:
        found = sorted({match for pattern in expand_braces(spec) for match in glob.glob(pattern)})
    if not found:
        raise DataError(f"{flag} {spec!r} matches no shard; give a .tar file, a folder of .tar files or a pattern "
                        "such as 'shards/part-{000..099}.tar' that names existing files")
    others = [name for name in found if not name.endswith(".tar")]
    if others:
        raise DataError(f"{flag} {spec!r} mixes formats: {others[0]} is not a .tar shard; give shards only")
    return found


@dataclass
class _Sample:
    """One sample's members: extension -> TarInfo (header only), from `shard`."""

    shard: str
    key: str
    members: dict[str, tarfile.TarInfo]


def _samples(shard: str) -> Iterator[_Sample | Damaged]:
    """The samples of `shard` in file order (consecutive members sharing a key, webdataset's convention), from
    its headers only; a `Damaged` last when the file ends early (inside a member or a header)."""
    count, current = 0, None
    try:
        with tarfile.open(shard, "r:") as tar:
            size = Path(shard).stat().st_size
            for member in tar:
                if not member.isfile():
                    continue
                if member.offset_data + member.size > size:
                    raise tarfile.ReadError("member past the end of the file")
                folder, _, name = member.name.rpartition("/")
                key, _, extension = name.partition(".")
                key = f"{folder}/{key}" if folder else key
                if current is None or current.key != key:
                    if current is not None:
                        count += 1
                        yield current
                    current = _Sample(shard, key, {})
                current.members[extension.lower()] = member
            if tar.offset + 2 * tarfile.BLOCKSIZE > size:  # no end-of-archive blocks: the file was cut short
                raise tarfile.ReadError("no end-of-archive marker")
    except (tarfile.ReadError, EOFError, OSError):
        if current is not None:
            count += 1
            yield current
        yield Damaged(f"{shard} (truncated after {count} samples)")
        return
    if current is not None:
        yield current


def count_samples(shard: str, captions: bool) -> int:
    """The samples of `shard` with an image member, from its headers.

    Raises:
        DataError: `captions` and no sample of the shard has a `.txt` member.
    """
    count = with_caption = 0
    for sample in _samples(shard):
        if isinstance(sample, _Sample) and any(ext in sample.members for ext in SHARD_IMAGE_EXTENSIONS):
            count += 1
            with_caption += "txt" in sample.members
    if captions and count and not with_caption:
        raise DataError(f"shard {shard} holds no caption (KEY.txt beside KEY.jpg); CLIP needs image-caption pairs: "
                        "add the captions, or train SimCLR on these images")
    return count


def _read(member: tarfile.TarInfo, shard: str) -> bytes:
    with open(shard, "rb") as handle:
        handle.seek(member.offset_data)
        data = handle.read(member.size)
    if len(data) != member.size:
        raise OSError(f"{shard}: {member.name} is cut short")
    return data


def shard_class(sample: _Sample) -> int | None:
    """The class of `sample`'s `KEY.cls` (None without one).

    Raises:
        ValueError: naming the member, unless it holds an integer in [0, MAX_SHARD_CLASSES).
    """
    if "cls" not in sample.members:
        return None
    member = sample.members["cls"]
    text = _read(member, sample.shard).decode("utf-8", errors="replace").strip()
    if not text.isdecimal() or not text.isascii() or int(text) >= MAX_SHARD_CLASSES:
        raise ValueError(f"{member.name}: class {text[:40]!r} is not an integer in [0, {MAX_SHARD_CLASSES})")
    return int(text)


def decode_sample(sample: _Sample, image_size: int, captions: bool,
                  labels: bool = False) -> tuple[torch.Tensor, str | None, int | None]:
    """(the (3, S, S) uint8 image, the caption or None, the class or None) of `sample`; the class is read only
    with `labels` (`shard_class`), and never in CLIP (`captions`), which has no use for it.

    Raises:
        ValueError / OSError: no image member, an image that fails to decode, a missing caption in CLIP, a bad
            class.
    """
    extension = next((ext for ext in SHARD_IMAGE_EXTENSIONS if ext in sample.members), None)
    if extension is None:
        raise ValueError("no image member")
    image = decode_image(io.BytesIO(_read(sample.members[extension], sample.shard)), image_size)
    caption = None
    if captions:
        if "txt" not in sample.members:
            raise ValueError("no caption")
        caption = _read(sample.members["txt"], sample.shard).decode("utf-8").strip()
        if not caption:
            raise ValueError("empty caption")
    label = shard_class(sample) if labels and not captions else None
    return image, caption, label


@dataclass
class ShardSet:
    """Training shards streamed by `ShardBatches` (data/streams.py's `StreamedFiles`); `len` is the epoch length
    in samples."""

    shards: list[str]
    num_samples: int
    image_size: int
    captions: bool
    shuffle_buffer: int
    skipped: list[str] = field(default_factory=list)
    items = "samples"

    def __len__(self) -> int:
        return self.num_samples

    @property
    def files(self) -> list[str]:
        return self.shards

    def units(self, shard: str) -> Iterator[_Sample | Damaged]:
        return _samples(shard)

    def item(self, sample: _Sample) -> _Sample:
        return sample  # decoded when its batch is made

    def head(self, count: int, seed: int, what: str) -> ImageSet:
        """The first `count` samples that decode of the shards in a permutation seeded by `seed`, in memory."""
        order = torch.randperm(len(self.shards), generator=torch.Generator().manual_seed(seed)).tolist()
        return decode_head([self.shards[i] for i in order], count, self.image_size, self.captions, what,
                           self.skipped)


def decode_head(shards: list[str], count: int, image_size: int, captions: bool, what: str,
                skipped: list[str]) -> ImageSet:
    """The first `count` samples of `shards` (in their order) that decode, in memory; the failures in `skipped`."""
    images, texts, labels, failed = [], [], [], []
    for shard in shards:
        for sample in _samples(shard):
            if len(images) == count:
                break
            if isinstance(sample, Damaged):
                failed.append(sample.name)
                continue
            try:
                image, caption, label = decode_sample(sample, image_size, captions, labels=True)
            except (*DECODE_ERRORS, UnicodeDecodeError) as error:
                failed.append(f"{sample.shard}:{sample.key} ({error})")
                continue
            images.append(image)
            texts.append(caption)
            labels.append(label)
    if failed:
        warnings.warn(f"skipped {len(failed)} {what} samples: {', '.join(failed[:10])}", stacklevel=2)
    skipped.extend(failed)
    if not images:
        raise DataError(f"no {what} sample of {shards[0]} ... decodes; check the shards")
    has_labels = all(label is not None for label in labels)
    return ImageSet(images=torch.stack(images), captions=texts if captions else None,
                    labels=torch.tensor(labels) if has_labels else None,
                    class_names=[str(c) for c in range(max(labels) + 1)] if has_labels else None)


def load_shards(spec: str, image_size: int, test_size: int, data_seed: int, captions: bool, shuffle_buffer: int,
                train_num_samples: int | None, held_out: bool = True) -> DataSplits:
    """The training shards of `spec` and, with `held_out`, the held-out samples from the head of a seeded shard
    order (the module docstring says which); without it the test set is empty (given by --eval-data)."""
    shards = find_shards(spec)
    skipped: list[str] = []
    test = None
    if held_out:
        order = torch.randperm(len(shards), generator=torch.Generator().manual_seed(data_seed)).tolist()
        held, total = [], 0
        for index in order:
            if total >= test_size:
                break
            held.append(shards[index])
            total += count_samples(shards[index], captions)
        if len(held) == len(shards):
            raise DataError(f"--test-size {test_size} takes every shard of {spec} (held out from the head of a "
                            "seeded shard order); give more shards, a smaller --test-size, or --eval-data")
        test = decode_head(held, test_size, image_size, captions, "held-out", skipped)
        shards = [shard for shard in shards if shard not in held]
    if train_num_samples is None:
        train_num_samples = sum(count_samples(shard, captions) for shard in shards)
    train = ShardSet(shards, train_num_samples, image_size, captions, shuffle_buffer, skipped)
    return DataSplits(train=train, test=test, name=f"shards:{spec}")


class ShardBatches(StreamBatches):
    """The batches of `data` (data/streams.py's order): SimCLR view pairs (`tokenizer` None) or CLIP (images,
    tokens), each sample decoded when its batch takes it."""

    def __init__(self, data: ShardSet, seed: int, batch_size: int, start_step: int, total_steps: int, rank: int,
                 world_size: int, workers: int, augmentation, tokenizer) -> None:
        super().__init__(data, seed, batch_size, start_step, total_steps, rank, world_size, workers)
        self.augmentation, self.tokenizer = augmentation, tokenizer

    def example(self, sample: _Sample, epoch: int, position: int):
        try:
            image, caption, _ = decode_sample(sample, self.data.image_size, self.data.captions)
        except (*DECODE_ERRORS, UnicodeDecodeError) as error:
            return Damaged(f"{sample.shard}:{sample.key} ({error})")
        if self.tokenizer is not None:
            return image, caption  # uint8: normalised on the device (run.py)
        generator = torch.default_generator
        outer = generator.get_state()
        generator.manual_seed((self.seed * SEED_STRIDE + epoch) * 10_000_019 + position)
        try:
            return self.augmentation(image), self.augmentation(image)
        finally:
            generator.set_state(outer)

    def collate(self, examples: list):
        if self.tokenizer is not None:
            images, captions = zip(*examples)
            return torch.stack(images), self.tokenizer(list(captions))
        first, second = zip(*examples)
        return torch.stack(first), torch.stack(second)
