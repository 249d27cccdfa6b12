"""webdataset shards (tar files of KEY.png + KEY.txt / KEY.cls), written here with PIL and tarfile: every sample
once per epoch across 2 ranks x 2 workers, a corrupt member and a truncated shard skipped and counted, resume
from the step, the held-out head, and bad input."""
import io
import json

import pytest
import torch
from PIL import Image

from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.data.images.lazy import decode_image
from gradcache.train.data.images.shards import (
    ShardBatches,
    ShardSet,
    count_samples,
    expand_braces,
    find_shards,
    load_shards,
)
from gradcache.train.errors import DataError
from tests.train.shard_files import write_shard


def _png(colour, fmt="PNG") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (10, 12), colour).save(out, format=fmt)
    return out.getvalue()




def _shards(folder, count: int, per_shard: int, captions=True, fmt="PNG"):
    folder.mkdir(parents=True, exist_ok=True)
    for shard in range(count):
        samples = []
        for index in range(per_shard):
            members = {fmt.lower() if fmt != "JPEG" else "jpg": _png((shard * 30, index * 40, 90), fmt),
                       "cls": str(index % 2).encode()}
            if captions:
                members["txt"] = f"sample {shard}-{index}".encode()
            samples.append((f"{shard:02d}{index:03d}", members))
        write_shard(folder / f"part-{shard:03d}.tar", samples)
    return folder


def _captions(batches):
    return [caption for (_, caption_list), _, _ in batches for caption in caption_list]


def _steps(data, rank, world, workers, start, total, batch=8):
    """Every batch a rank's workers make, in step order, as its loader would interleave them (in one process)."""
    made = {}
    for worker in range(workers):
        stream = ShardBatches(data, 0, batch, start, total, rank, world, workers, None, list)
        for offset, item in enumerate(stream.worker_batches(worker)):
            made[start + worker + offset * workers] = item
    return [made[step] for step in sorted(made)]


def test_expand_braces_and_find_shards(tmp_path):
    assert expand_braces("p-{008..010}.tar") == ["p-008.tar", "p-009.tar", "p-010.tar"]
    assert expand_braces("{a,b}-{1..2}") == ["a-1", "a-2", "b-1", "b-2"]
    _shards(tmp_path / "s", 3, 2)
    assert len(find_shards(str(tmp_path / "s" / "part-{000..001}.tar"))) == 2
    assert find_shards(str(tmp_path / "s")) == sorted(str(p) for p in (tmp_path / "s").glob("*.tar"))
    with pytest.raises(DataError, match="matches no shard"):
        find_shards(str(tmp_path / "s" / "nothing-*.tar"))
    (tmp_path / "s" / "notes.txt").write_text("x")
    with pytest.raises(DataError, match="mixes formats.*notes.txt"):
        find_shards(str(tmp_path / "s" / "*"))


def test_every_sample_once_per_epoch_across_2_ranks_x_2_workers(tmp_path):
    data = ShardSet(find_shards(str(_shards(tmp_path / "s", 8, 6))), 48, 8, captions=True, shuffle_buffer=5)
    every = {f"sample {s}-{i}" for s in range(8) for i in range(6)}
    for epoch in range(2):  # 48 samples, batch 8: 6 steps per epoch
        seen = []
        for rank in range(2):
            seen += _captions(_steps(data, rank, 2, 2, 6 * epoch, 6 * epoch + 6))
        assert len(seen) == 48 and set(seen) == every


def test_a_slot_that_runs_out_resamples_and_every_rank_makes_the_same_steps(tmp_path):
    paths = find_shards(str(_shards(tmp_path / "s", 3, 4)))  # 12 samples; 2 ranks x 1 worker: 2 and 1 shards
    data = ShardSet(paths, 12, 8, captions=True, shuffle_buffer=3)
    steps = [_steps(data, rank, 2, 1, 0, 3, batch=8) for rank in range(2)]  # 12 // 8 = 1 step per epoch
    assert [len(s) for s in steps] == [3, 3] and all(len(b[0][1]) == 4 for s in steps for b in s)


def test_resume_from_a_step_continues_with_the_uninterrupted_batches(tmp_path):
    data = ShardSet(find_shards(str(_shards(tmp_path / "s", 4, 6))), 24, 8, captions=True, shuffle_buffer=4)
    whole = _steps(data, 0, 1, 2, 0, 7)  # 3 steps per epoch: crosses two
    resumed = _steps(data, 0, 1, 2, 4, 7)
    assert _captions(resumed) == _captions(whole[4:])
    for (images, _), _, _ in resumed:
        assert images.shape == (8, 3, 8, 8)


def test_a_corrupt_member_and_a_truncated_shard_are_skipped_and_counted(tmp_path):
    folder = _shards(tmp_path / "s", 2, 6)
    write_shard(folder / "part-002.tar", [("bad00", {"png": b"not a png", "txt": b"broken"}),
                                          *[(f"ok{i}", {"png": _png((i, 0, 0)), "txt": f"ok {i}".encode()})
                                            for i in range(5)]])
    whole = (folder / "part-001.tar").read_bytes()
    (folder / "part-001.tar").write_bytes(whole[:len(whole) * 2 // 3])  # cut inside a member
    paths = find_shards(str(folder))
    assert count_samples(paths[1], captions=True) < 6
    data = ShardSet(paths, 16, 8, captions=True, shuffle_buffer=2)  # more than the 15 or fewer samples: all read
    batches = _steps(data, 0, 1, 1, 0, 4, batch=4)
    failed = [name for _, _, names in batches for name in names]
    assert any("bad00" in name for name in failed) and any("part-001.tar (truncated" in name for name in failed)
    assert all(len(captions) == 4 for (_, captions), _, _ in batches)
    assert "broken" not in _captions(batches)


def test_held_out_is_the_head_of_a_seeded_shard_order_and_left_out_of_training(tmp_path):
    folder = _shards(tmp_path / "s", 4, 5)
    splits = load_shards(str(folder), 8, test_size=7, data_seed=3, captions=True, shuffle_buffer=4,
                         train_num_samples=None)
    paths = find_shards(str(folder))
    order = torch.randperm(4, generator=torch.Generator().manual_seed(3)).tolist()
    held = [paths[i] for i in order[:2]]  # 5 + 5 >= 7
    assert splits.train.shards == [p for p in paths if p not in held] and len(splits.train) == 10
    first = order[0]
    assert splits.test.captions[:5] == [f"sample {first}-{i}" for i in range(5)] and len(splits.test) == 7
    assert torch.equal(splits.test.images[0], decode_image(io.BytesIO(_png((first * 30, 0, 90))), 8))


def test_clip_and_simclr_train_on_shards(tmp_path, tiny_args):
    folder = _shards(tmp_path / "s", 6, 8)
    for mode in ("clip", "simclr"):
        reference = ["--eval-reference-size", "16"] if mode == "simclr" else []
        assert main(tiny_args(mode, tmp_path / mode, "--data", str(folder), "--test-size", "8", *reference,
                              "--shuffle-buffer", "4")) == errors.OK
        metrics = json.loads((tmp_path / mode / "metrics.json").read_text())
        assert (metrics["train_size"], metrics["test_size"], metrics["skipped_images"]) == (40, 8, 0)


def test_shards_without_captions_in_clip_or_matching_nothing_exit_2_writing_nothing(tmp_path, tiny_args, capsys):
    folder = _shards(tmp_path / "s", 3, 4, captions=False)
    assert main(tiny_args("clip", tmp_path / "out", "--data", str(folder), "--test-size", "4")) == errors.USAGE
    assert "holds no caption" in capsys.readouterr().err
    pattern = str(tmp_path / "s" / "other-{0..3}.tar")
    assert main(tiny_args("clip", tmp_path / "out", "--data", pattern)) == errors.USAGE
    assert "matches no shard" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_run_on_shards_resumes_with_the_uninterrupted_losses(tmp_path, tiny_args, killed_after_step):
    folder = _shards(tmp_path / "s", 5, 8)  # 8 held out (one shard), 32 training samples: 4 steps per epoch
    args = ["--data", str(folder), "--test-size", "8", "--steps", "4", "--checkpoint-every", "2",
            "--batch-size", "8", "--shuffle-buffer", "4"]  # resumed from step 2: in the middle of epoch 0
    assert main(tiny_args("clip", tmp_path / "whole", *args)) == errors.OK
    killed_after_step(3, tiny_args("clip", tmp_path / "cut", *args))
    assert main(["train", "clip", "--resume", str(tmp_path / "cut"), "--quiet", "--workers", "0"]) == errors.OK
    logs = [(tmp_path / run / "train_log.csv").read_text().splitlines() for run in ("whole", "cut")]
    assert [row.split(",")[2] for row in logs[0]] == [row.split(",")[2] for row in logs[1]]


def test_train_num_samples_without_shards_exits_2(tmp_path, tiny_args, capsys):
    assert main(tiny_args("simclr", tmp_path / "out", "--train-num-samples", "64")) == errors.USAGE
    assert "--train-num-samples" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_eval_data_as_shards_is_held_out_whole_and_the_training_shards_are_all_trained_on(tmp_path, tiny_args):
    train, evaluation = _shards(tmp_path / "train", 4, 8), _shards(tmp_path / "eval", 2, 5)
    assert main(tiny_args("clip", tmp_path / "out", "--data", str(train), "--eval-data", str(evaluation))) == 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert (metrics["train_size"], metrics["test_size"]) == (32, 10)


def test_the_loader_interleaves_its_worker_processes_in_step_order(tmp_path):
    from gradcache.train.data.images.shards import shard_loader

    data = ShardSet(find_shards(str(_shards(tmp_path / "s", 4, 6))), 24, 8, captions=True, shuffle_buffer=4)
    expected = _captions(_steps(data, 0, 1, 2, 1, 6))
    batches = ShardBatches(data, 0, 8, 1, 6, 0, 1, 2, None, list)
    assert _captions(list(shard_loader(batches, workers=2))) == expected
