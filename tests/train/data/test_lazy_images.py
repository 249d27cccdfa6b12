"""Image folders and caption tables decoded when drawn: the same examples as decoding every file at start, the
same batches whatever the number of workers, bad files replaced and counted, --max-bad-share as the run goes,
exact resume, --eval-data, and SimCLR's bounded kNN reference set."""
import csv
import json

import pytest
import torch
from PIL import Image

from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.data.held_out import held_out_order
from gradcache.train.data import bad_data
from gradcache.train.data.images.augment import simclr_augmentation
from gradcache.train.data.images.files import (
    decode_image,
    list_image_folder,
    load_caption_table,
    load_image_folder,
)
from gradcache.train.data.images.lazy import LazyImageSet, reference_set
from gradcache.train.data.images.sets import ImageSet
from gradcache.train.data.images.training_batches import training_batches
from gradcache.train.data.order import StepSampler
from gradcache.train.errors import TooMuchBadData


def _folder(root, per_class: int, classes=("cat", "dog")):
    """`per_class` distinct images (colour from class and index, sizes vary) in each class folder."""
    for label, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            Image.new("RGB", (12 + index % 3, 10), (label * 120 + index * 4, 255 - index * 7, 30 + label * 90)).save(
                root / name / f"{index:03d}.png")
    return root


def _losses(folder) -> list[str]:
    with open(folder / "train_log.csv", newline="") as handle:
        return [row["loss"] for row in csv.DictReader(handle)]


def test_image_folder_holds_out_and_draws_what_decoding_every_file_at_start_gives(tmp_path):
    root = _folder(tmp_path / "data", 10)
    paths = sorted(root.glob("*/*.png"))  # class folders sorted, files sorted: the ImageFolder order
    every = torch.stack([decode_image(path, 8) for path in paths])  # the loader before: all decoded at start
    labels = torch.tensor([0 if path.parent.name == "cat" else 1 for path in paths])
    order = held_out_order(len(paths), 6, 3, "images")
    splits = load_image_folder(root, 8, test_size=6, seed=3)
    assert torch.equal(splits.test.images, every[order[:6]]) and torch.equal(splits.test.labels, labels[order[:6]])
    assert len(splits.train) == 14
    for position, index in enumerate(order[6:].tolist()):
        drawn, image, read, failed = splits.train.draw(position)
        assert (drawn, read, failed) == (position, 1, [])
        assert torch.equal(image, every[index]) and splits.train.labels[position] == labels[index]


def test_caption_table_holds_out_and_draws_what_decoding_every_file_at_start_gives(tmp_path):
    rows = []
    for index in range(9):
        Image.new("RGB", (10, 14), (index * 25, 0, 200)).save(tmp_path / f"{index}.png")
        rows.append(f"{index}.png,picture {index}")
    (tmp_path / "pairs.csv").write_text("filepath,title\n" + "\n".join(rows) + "\n")
    every = [decode_image(tmp_path / f"{index}.png", 8) for index in range(9)]
    order = held_out_order(9, 3, 0, "images").tolist()
    splits = load_caption_table(tmp_path / "pairs.csv", 8, 3, 0)
    assert splits.test.captions == [f"picture {i}" for i in order[:3]]
    assert all(torch.equal(splits.test.images[k], every[i]) for k, i in enumerate(order[:3]))
    for position, index in enumerate(order[3:]):
        assert torch.equal(splits.train.draw(position)[1], every[index])
        assert splits.train.captions[position] == f"picture {index}"


def test_a_file_that_fails_is_replaced_by_the_next_in_file_order_and_counted(tmp_path):
    root = _folder(tmp_path / "data", 3, classes=("a",))
    paths = [str(path) for path in sorted(root.glob("a/*.png"))]
    (root / "a" / "001.png").write_bytes(b"not a png")
    images = LazyImageSet(paths=paths, image_size=8)
    drawn, image, read, failed = images.draw(1)
    assert (drawn, read, failed) == (2, 2, [paths[1]]) and torch.equal(image, decode_image(paths[2], 8))
    assert images.draw(2)[0] == 2 and images.draw(0)[:3:2] == (0, 1)


def _batches(images, workers: int, steps: int = 6, max_bad_share: float = 1.0):
    sampler = StepSampler(len(images), 4, seed=5, start_step=0, total_steps=steps)
    return training_batches(images, sampler, simclr_augmentation(8), None, workers, max_bad_share)


def test_batches_of_a_lazy_set_are_the_in_memory_ones_whatever_the_workers(tmp_path):
    root = _folder(tmp_path / "data", 5)
    every = list_image_folder(root, 8)
    in_memory = ImageSet(images=torch.stack([decode_image(path, 8) for path in every.paths]), labels=every.labels)
    expected = list(_batches(in_memory, workers=0))
    for workers in (0, 2):
        got = list(_batches(list_image_folder(root, 8), workers))
        assert len(got) == len(expected) == 6
        for (first, second), (want_first, want_second) in zip(got, expected):
            assert torch.equal(first, want_first) and torch.equal(second, want_second)


def test_bad_files_are_counted_the_same_whatever_the_workers(tmp_path):
    root = _folder(tmp_path / "data", 5)
    (root / "dog" / "002.png").write_bytes(b"not a png")
    counts = []
    for workers in (0, 2):
        images = list_image_folder(root, 8)
        with pytest.warns(UserWarning, match="002.png"):
            views = [first for first, _ in _batches(images, workers)]
        assert all(len(batch) == 4 for batch in views)
        counts.append((len(images.skipped), [v.sum().item() for v in views]))
    assert counts[0] == counts[1] and counts[0][0] > 0


def test_more_bad_files_than_the_share_allows_stops_once_enough_were_read(tmp_path, monkeypatch):
    root = _folder(tmp_path / "data", 8, classes=("a",))
    for index in range(0, 8, 2):  # every other file: half of the draws fail once
        (root / "a" / f"{index:03d}.png").write_bytes(b"not a png")
    monkeypatch.setattr(bad_data, "BAD_SHARE_MIN_READS", 24)
    images = list_image_folder(root, 8)
    batches = _batches(images, workers=0, steps=40, max_bad_share=0.3)
    reads_before_each_batch = []

    def consume():
        for _ in batches:
            reads_before_each_batch.append(batches.bad_share.read)

    with pytest.warns(UserWarning), pytest.raises(TooMuchBadData, match="images read so far.*--max-bad-share 0.3"):
        consume()
    assert reads_before_each_batch and max(reads_before_each_batch) < 24  # not refused before 24 were read
    assert batches.bad_share.read >= 24 and len(images.skipped) == batches.bad_share.bad > 0.3 * 24
    # under the share: the whole run goes through
    list(_batches(list_image_folder(root, 8), workers=0, steps=40, max_bad_share=0.6))


def test_reference_set_is_bounded_seeded_and_drawn_from_the_training_images(tmp_path):
    images = ImageSet(images=torch.arange(10, dtype=torch.uint8).view(10, 1, 1, 1).expand(10, 3, 2, 2).clone(),
                      labels=torch.arange(10))
    reference = reference_set(images, 4, seed=1)
    assert len(reference) == 4
    again = reference_set(images, 4, seed=1)
    assert torch.equal(reference.labels, again.labels) and len(set(reference.labels.tolist())) == 4
    assert torch.equal(reference.images[:, 0, 0, 0], reference.labels.to(torch.uint8))
    assert torch.equal(reference_set(images, 20, seed=1).labels, torch.arange(10))  # fewer: all of them
    lazy_set = list_image_folder(_folder(tmp_path / "data", 4), 8)
    decoded = reference_set(lazy_set, 3, seed=0)
    assert isinstance(decoded, ImageSet) and len(decoded) == 3


@pytest.mark.slow
def test_simclr_on_an_image_folder_resumes_exactly(tmp_path, tiny_args, killed_after_step):
    root = _folder(tmp_path / "data", 20)
    args = ["--data", str(root), "--test-size", "8", "--steps", "4", "--checkpoint-every", "2",
            "--eval-reference-size", "12"]  # 32 training files, batch 16: 2 steps per epoch, crosses one
    assert main(tiny_args("simclr", tmp_path / "whole", *args)) == 0
    killed_after_step(3, tiny_args("simclr", tmp_path / "cut", *args))
    assert main(["train", "simclr", "--resume", str(tmp_path / "cut"), "--quiet", "--workers", "0"]) == 0
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "whole")


@pytest.mark.parametrize("mode", ["simclr", "clip"])
def test_eval_data_is_the_held_out_set_and_the_training_data_is_used_whole(tmp_path, tiny_args, mode):
    if mode == "simclr":
        data, evaluation = _folder(tmp_path / "train", 12), _folder(tmp_path / "eval", 5)
    else:
        for name, count in (("train", 24), ("eval", 10)):
            (tmp_path / name).mkdir()
            for index in range(count):
                Image.new("RGB", (10, 10), (index * 9, 40, 200)).save(tmp_path / name / f"{index}.png")
            (tmp_path / name / "pairs.csv").write_text("filepath,title\n" + "\n".join(
                f"{index}.png,picture {index % 7}" for index in range(count)) + "\n")
        data, evaluation = tmp_path / "train" / "pairs.csv", tmp_path / "eval" / "pairs.csv"
    assert main(tiny_args(mode, tmp_path / "out", "--data", str(data), "--eval-data", str(evaluation))) == 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert (metrics["train_size"], metrics["test_size"]) == (24, 10)


def test_eval_data_that_does_not_exist_exits_2_naming_it(tmp_path, tiny_args, capsys):
    status = main(tiny_args("simclr", tmp_path / "out", "--eval-data", str(tmp_path / "nowhere")))
    assert status == errors.USAGE and "--eval-data" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_run_meeting_more_bad_files_than_the_share_allows_exits_4(tmp_path, tiny_args, monkeypatch, capsys):
    root = _folder(tmp_path / "data", 20)
    paths = sorted(root.glob("*/*.png"))
    for index in held_out_order(40, 8, 0, "images")[8::3].tolist():  # 11 of the 32 training files, none held out
        paths[index].write_bytes(b"not a png")
    monkeypatch.setattr(bad_data, "BAD_SHARE_MIN_READS", 16)
    with pytest.warns(UserWarning, match="failed to decode"):
        status = main(tiny_args("simclr", tmp_path / "out", "--data", str(root), "--test-size", "8",
                                "--max-bad-share", "0.1"))
    assert status == errors.DATA_ERROR == 4
    error = capsys.readouterr().err
    assert "images read so far" in error and "--max-bad-share 0.1" in error
