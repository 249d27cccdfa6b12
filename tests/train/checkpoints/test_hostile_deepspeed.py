"""A `last.ds` from elsewhere runs no code (issue 40 item 1): DeepSpeed reads its files with pickle, so a file whose
`__reduce__` would create a marker file is planted into copies of one real ZeRO-2 checkpoint (a one-process LoRA
run on the tiny decoder, built once for the module), and each command must leave the marker uncreated: (a) an
exported model folder holding a planted `last.ds` encodes as the folder it is; (b) a `last.pt` run with a
`last.ds` beside it is refused, naming both; (c) a file the save did not list, or an `extra.pt` without its list,
is refused by `gradcache export`; (d) a payload inside DeepSpeed's own state dicts, the sums recomputed, is
refused by `--resume`. The clean checkpoint still evaluates, exports and resumes. Then the statuses of item 6 (a
full disk while writing `last.ds` or `encode`'s output: 74) and item 7 (SIGTERM during a save stops there)."""
from __future__ import annotations

import errno
import io
import json
import os
import re
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.checkpoints.atomic import EXTRA_FILE, read_checked, save_checkpoint
from gradcache.train.checkpoints.checksum import files_sha256
from gradcache.train.checkpoints.deepspeed_checkpoint import FILES_KEY, TAG
from tests.tiny_decoder_model import write_tiny_decoder
from tests.train.conftest import text_args

pytest.importorskip("deepspeed", reason='pip install -e ".[deepspeed]"')
pytest.importorskip("peft", reason='the dev extra installs it: pip install -e ".[dev]"')
LORA = ["--pooling", "last", "--lora-rank", "4", "--lora-dropout", "0", "--steps", "2", "--checkpoint-every", "1",
        "--eval-every", "0", "--threads", "1"]
MODEL_STATES = "mp_rank_00_model_states.pt"  # ZeRO-1/2: the module's weights, read by zero_to_fp32 and resumes
OPTIM_STATES = "zero_pp_rank_0_mp_rank_00_optim_states.pt"  # rank 0's optimizer partition


class Payload:
    """Unpickled by pickle itself, it creates `marker`: what code in a hostile checkpoint could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A ZeRO-2 run (last.ds, previous.ds, model/) and the same run without DeepSpeed (last.pt), one process."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    root = tmp_path_factory.mktemp("hostile_deepspeed")
    write_tiny_decoder(root / "llama", "llama", padding_side="left")
    (root / "zero2.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    assert main(text_args(root / "llama", root / "zero2", *LORA, "--deepspeed", str(root / "zero2.json"))) == 0
    assert main(text_args(root / "llama", root / "file", *LORA)) == 0
    (root / "texts.txt").write_text("who bakes bread?\nthe baker bakes bread\n")
    return root


def _main(argv: list[str]) -> int | Exception:
    """main's status, or the error it let through (a traceback): the marker is asserted on either way."""
    try:
        return main(argv)
    except Exception as error:
        return error


def _copy(runs: Path, tmp_path: Path, name: str = "zero2") -> Path:
    shutil.copytree(runs / name, tmp_path / name)
    return tmp_path / name


def _plant(file: Path, marker: Path) -> None:
    """`file` (one of DeepSpeed's dicts) with the payload among its entries."""
    state = torch.load(file, weights_only=False)  # this test's own file
    state["payload"] = Payload(marker)
    torch.save(state, file)


def _recompute_sums(checkpoint: Path) -> None:
    """extra.pt's sha256 of every file, and its own checksum, as a careful forger recomputes them."""
    extra = read_checked(checkpoint / EXTRA_FILE)
    save_checkpoint({**extra, FILES_KEY: files_sha256(checkpoint / TAG)}, checkpoint / EXTRA_FILE)


@pytest.mark.slow
def test_a_payload_in_real_state_dicts_with_the_sums_recomputed_is_refused_on_resume(runs, tmp_path, capsys):
    """(d): refused without running, the run resumes from previous.ds, as past any damaged newest checkpoint;
    so the clean previous.ds resumes too: the weights-only read allows what DeepSpeed writes (the one essential
    check of the default stage)."""
    marker = tmp_path / "ran"
    run = _copy(runs, tmp_path)
    _plant(run / "last.ds" / TAG / OPTIM_STATES, marker)
    _recompute_sums(run / "last.ds")
    status = _main(["train", "text", "--resume", str(run), "--steps", "3", "--quiet", "--threads", "1"])
    err = capsys.readouterr().err
    assert not marker.exists()
    assert status == 0, err
    assert f"{OPTIM_STATES} holds something other than tensors" in err and "refused without running any of it" in err
    assert (run / "last.ds.damaged").is_dir()  # set aside: the next save keeps the one resumed from
    assert read_checked(run / "previous.ds" / EXTRA_FILE)["step"] == 1  # resumed from step 1 ...
    assert read_checked(run / "last.ds" / EXTRA_FILE)["step"] == 3  # ... to step 3


def test_an_exported_folder_with_a_planted_last_ds_encodes_as_the_folder_it_is(runs, tmp_path):
    """(a): the folder is a model folder, never a run; the reference is the same folder without last.ds."""
    marker = tmp_path / "ran"
    folder = tmp_path / "downloaded"
    shutil.copytree(runs / "zero2" / "model", folder)
    shutil.copytree(runs / "zero2" / "last.ds", folder / "last.ds")
    _plant(folder / "last.ds" / TAG / MODEL_STATES, marker)
    _recompute_sums(folder / "last.ds")
    data = str(runs / "texts.txt")
    status = _main(["encode", str(folder), "--data", data, "--output", str(tmp_path / "got.npy")])
    assert not marker.exists()
    assert status == 0
    assert main(["encode", str(runs / "zero2" / "model"), "--data", data, "--output",
                 str(tmp_path / "want.npy")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "got.npy"), np.load(tmp_path / "want.npy"))


def test_a_last_pt_run_with_a_last_ds_beside_it_is_refused_naming_both(runs, tmp_path, capsys):
    """(b): a run writes one kind; which one is the run's cannot be told, so neither is read."""
    marker = tmp_path / "ran"
    run = _copy(runs, tmp_path, "file")
    shutil.copytree(runs / "zero2" / "last.ds", run / "last.ds")
    _plant(run / "last.ds" / TAG / MODEL_STATES, marker)
    _recompute_sums(run / "last.ds")
    status = _main(["eval", str(run)])
    err = capsys.readouterr().err
    assert not marker.exists()
    assert status == errors.USAGE
    assert "holds checkpoints of 2 kinds" in err and "last.ds" in err and "last.pt" in err


@pytest.mark.parametrize("forgery", ["unlisted", "no list"])
def test_a_file_the_save_did_not_list_is_refused_by_export(runs, tmp_path, capsys, forgery):
    """(c): zero_to_fp32 reads every *_optim_states.pt there is; an extra.pt without `files` lists none."""
    marker = tmp_path / "ran"
    run = _copy(runs, tmp_path)
    checkpoint = run / "last.ds"
    if forgery == "unlisted":
        planted = checkpoint / TAG / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
        shutil.copy(checkpoint / TAG / OPTIM_STATES, planted)
        _plant(planted, marker)
        expected = f"{TAG}/{planted.name}, which its extra.pt does not list"
    else:
        _plant(checkpoint / TAG / OPTIM_STATES, marker)
        extra = read_checked(checkpoint / EXTRA_FILE)
        save_checkpoint({k: v for k, v in extra.items() if k != FILES_KEY}, checkpoint / EXTRA_FILE)
        expected = "lacks the list of its files"
    shutil.rmtree(run / "previous.ds")  # else the run falls back to it, as for any damaged newest checkpoint
    status = _main(["export", str(run), "--output", str(tmp_path / "exported")])
    err = capsys.readouterr().err
    assert not marker.exists()
    assert status == errors.USAGE
    assert expected in err and not (tmp_path / "exported").exists()


def test_the_clean_checkpoint_evaluates_and_exports(runs, tmp_path, capsys):
    run = _copy(runs, tmp_path)
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 2
    assert main(["export", str(run), "--output", str(tmp_path / "exported")]) == 0
    from safetensors.torch import load_file

    got, want = (load_file(folder / "model.safetensors") for folder in (tmp_path / "exported", run / "model"))
    assert got.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=0, msg=key)


def test_export_of_the_previous_checkpoint_reads_previous_ds_and_never_a_planted_one(runs, tmp_path, capsys):
    """`--checkpoint previous` is the previous checkpoint of the run's own kind: previous.ds of a --deepspeed run
    (what giving its path exports), and in a last.pt run with a previous.ds planted beside it, none is read."""
    from safetensors.torch import load_file

    run = _copy(runs, tmp_path)
    assert main(["export", str(run), "--checkpoint", "previous", "--output", str(tmp_path / "previous")]) == 0
    assert main(["export", str(run), "--checkpoint", str(run / "previous.ds"), "--output", str(tmp_path / "path")]) == 0
    got, want = (load_file(tmp_path / name / "model.safetensors") for name in ("previous", "path"))
    assert got.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=0, msg=key)
    marker = tmp_path / "ran"
    planted = _copy(runs, tmp_path, "file")
    shutil.copytree(runs / "zero2" / "previous.ds", planted / "previous.ds")
    _plant(planted / "previous.ds" / TAG / MODEL_STATES, marker)
    _recompute_sums(planted / "previous.ds")
    capsys.readouterr()
    status = _main(["export", str(planted), "--checkpoint", "previous", "--output", str(tmp_path / "planted")])
    assert not marker.exists()
    assert status == errors.USAGE and "holds checkpoints of 2 kinds" in capsys.readouterr().err


def test_the_weights_only_read_refuses_a_payload_before_running_it(tmp_path):
    from gradcache.train.checkpoints.safe_unpickling import screen_pickle
    from gradcache.train.errors import CheckpointError

    marker, file = tmp_path / "ran", tmp_path / "state.pt"
    torch.save({"module": {"weight": torch.ones(2)}, "payload": Payload(marker)}, file)
    with pytest.raises(CheckpointError, match="state.pt holds something other than tensors"):
        screen_pickle(file, tmp_path)
    assert not marker.exists()
    torch.save({"module": {"weight": torch.ones(2)}}, file)
    screen_pickle(file, tmp_path)  # plain values and tensors pass


@pytest.mark.slow  # two more DeepSpeed runs
@pytest.mark.parametrize("stage", [1, 3])
def test_every_class_deepspeed_writes_at_stages_1_and_3_is_allowed(tmp_path, stage):
    """What torch's weights-only reader would refuse in a real checkpoint is exactly `deepspeed_globals()`'s."""
    from torch.serialization import get_unsafe_globals_in_checkpoint

    from gradcache.train.checkpoints.safe_unpickling import deepspeed_globals

    write_tiny_decoder(tmp_path / "llama", "llama", padding_side="left")
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": stage}}))
    assert main(text_args(tmp_path / "llama", tmp_path / "run", *LORA, "--deepspeed", str(tmp_path / "ds.json"))) == 0
    allowed = {f"{cls.__module__}.{cls.__qualname__}" for cls in deepspeed_globals()}
    found = {name for file in (tmp_path / "run" / "last.ds" / TAG).iterdir()
             for name in get_unsafe_globals_in_checkpoint(file)}
    assert found and found <= allowed
    assert main(["eval", str(tmp_path / "run")]) == 0


# --- item 6: a full disk ------------------------------------------------------------------------------------


def _failing_second_save(monkeypatch, fail) -> None:
    """The run's second last.ds save fills the disk (1 KiB left) and calls `fail` where its writes run; the others
    save as usual."""
    import collections

    from deepspeed.runtime.engine import DeepSpeedEngine

    original, calls, real_usage = DeepSpeedEngine.save_checkpoint, [], shutil.disk_usage
    usage = collections.namedtuple("usage", "total used free")

    def save_checkpoint(self, save_dir, *args, **kwargs):
        calls.append(save_dir)
        if len(calls) != 2:
            monkeypatch.setattr(shutil, "disk_usage", real_usage)
            return original(self, save_dir, *args, **kwargs)
        monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(real_usage(path).total, 0, 1024))
        return fail(monkeypatch, lambda: original(self, save_dir, *args, **kwargs), save_dir)

    monkeypatch.setattr(DeepSpeedEngine, "save_checkpoint", save_checkpoint)


def _unexpected_pos(monkeypatch, save, save_dir):
    """torch.save to a path that hits ENOSPC: its C++ writer raises a bare RuntimeError, the disk then full."""
    save()
    raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 2048 vs 1932")


def _copy_fails(monkeypatch, save, save_dir):
    """The copy of zero_to_fp32.py beside the files."""
    save()
    raise OSError(errno.ENOSPC, "No space left on device", str(Path(save_dir) / "zero_to_fp32.py"))


def _extra_fails(monkeypatch, save, save_dir):
    """DeepSpeed's files fit; extra.pt beside them does not (torch.save to a file object: OSError in the chain)."""
    result = save()
    real_save = torch.save

    def save_extra(obj, f, *args, **kwargs):
        if EXTRA_FILE in getattr(f, "name", ""):
            monkeypatch.setattr(torch, "save", real_save)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_extra)
    return result


@pytest.mark.slow
@pytest.mark.parametrize("fail", [_unexpected_pos, _copy_fails, _extra_fails], ids=["unexpected-pos", "copy", "extra"])
def test_a_full_disk_while_writing_last_ds_exits_74_with_the_real_size_and_fallback(runs, tmp_path, capsys,
                                                                                   monkeypatch, fail):
    run = tmp_path / "run"
    _failing_second_save(monkeypatch, fail)
    status = main(text_args(runs / "llama", run, *LORA, "--deepspeed", str(runs / "zero2.json")))
    err = capsys.readouterr().err
    assert status == errors.DISK_FULL, err
    assert read_checked(run / "last.ds" / EXTRA_FILE)["step"] == 1  # step 1's checkpoint, kept
    size = sum(p.stat().st_size for p in (run / "last.ds").rglob("*") if p.is_file())
    (needed,) = re.findall(r"it needs about ([\d.e-]+) MiB", err)
    assert float(needed) * 2**20 >= 0.95 * size  # a save of it needs as much as the one before (2 digits shown)
    assert f"continue with --resume {run}" in err and ".partial" not in err and not (run / "last.ds.partial").exists()
    assert main(["train", "text", "--resume", str(run), "--quiet", "--threads", "1"]) == 0  # the fallback it names
    assert read_checked(run / "last.ds" / EXTRA_FILE)["step"] == 2


def test_a_full_disk_while_encode_writes_exits_74_and_leaves_no_file(tiny_bert, tmp_path, capsys, monkeypatch):
    (tmp_path / "texts.txt").write_text("who bakes bread?\nthe baker bakes bread\n")

    def save(handle, array, *args, **kwargs):
        handle.write(b"\x93NUMPY")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "save", save)
    output = tmp_path / "out.npy"
    assert main(["encode", str(tiny_bert), "--data", str(tmp_path / "texts.txt"), "--output", str(output)]) == 74
    err = capsys.readouterr().err
    assert f"no space left to write {output}" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["texts.txt"]


# --- item 7: SIGTERM during a save ---------------------------------------------------------------------------


def test_sigterm_during_a_save_stops_at_that_checkpoint(tmp_path, tiny_args, capsys, monkeypatch):
    from gradcache.train.checkpoints.atomic import load_checkpoint
    from gradcache.train.checkpoints.run_checkpoint import FileCheckpoint

    original = FileCheckpoint.save

    def save(self, trained, optimizer, meta):
        original(self, trained, optimizer, meta)
        if meta["step"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # handled inside this call: the save is in progress

    monkeypatch.setattr(FileCheckpoint, "save", save)
    run = tmp_path / "run"
    argv = tiny_args("simclr", run, "--steps", "5", "--checkpoint-every", "2", "--threads", "1")
    assert main(argv) == errors.PREEMPTED
    assert "after step 2 of 5" in capsys.readouterr().err
    assert load_checkpoint(run)["step"] == 2
    assert len((run / "train_log.csv").read_text().splitlines()) == 1 + 2  # header, steps 1 and 2: no step 3


# --- issue 49 item 1: the screen cannot be raced, links are refused -------------------------------------------


def _swap_after_close(monkeypatch, checkpoint: Path, nth: int, marker: Path) -> list[str]:
    """On the `nth` close of a file the screen read from `checkpoint`, rename payload copies of DeepSpeed's two
    files over the originals (as an attacker told by inotify would); the names closed, in order, are returned."""
    from gradcache.train.checkpoints import regular_files

    payloads = {}
    for name in (MODEL_STATES, OPTIM_STATES):
        payload = checkpoint.parent / f".{name}.payload"
        shutil.copy(checkpoint / TAG / name, payload)
        _plant(payload, marker)
        payloads[name] = payload
    closed: list[str] = []
    original = regular_files.open_regular

    class Swapping(io.BufferedReader):
        def close(self):
            was_open = not self.closed
            super().close()
            if was_open and self.path.is_relative_to(checkpoint):
                closed.append(self.path.name)
                if len(closed) == nth:
                    for name, payload in payloads.items():
                        os.replace(payload, checkpoint / TAG / name)

    def open_regular(path, checkpoint_path=None):
        handle = original(path, checkpoint_path)
        descriptor = os.dup(handle.fileno())
        handle.close()
        reader = Swapping(io.FileIO(descriptor, "rb"))
        reader.path = Path(path)
        return reader

    monkeypatch.setattr(regular_files, "open_regular", open_regular)
    return closed


@pytest.mark.slow
@pytest.mark.parametrize("nth", [1, 2, 3])
@pytest.mark.parametrize("command", ["export", "resume"])
def test_a_file_swapped_after_the_screen_closes_it_is_never_read(runs, tmp_path, capsys, monkeypatch, command, nth):
    """The race of issue 49: payloads renamed over the model and optimizer states right after the screen's 1st,
    2nd or 3rd close (extra.pt, the model states, the optimizer partition) run no code. After the 3rd, both were
    screened: DeepSpeed and zero_to_fp32 read the screened private copy, and last.ds loads as it was written (the
    export equals the run's own model/). After the 1st or 2nd, a swapped file is one the screen has yet to read: it
    reads the payload, refuses it, and the command falls back to previous.ds (the export equals previous.ds's)."""
    from safetensors.torch import load_file

    marker = tmp_path / "ran"
    run = _copy(runs, tmp_path)
    closed = _swap_after_close(monkeypatch, run / "last.ds", nth, marker)
    if command == "export":
        status = _main(["export", str(run), "--output", str(tmp_path / "exported")])
    else:
        status = _main(["train", "text", "--resume", str(run), "--steps", "3", "--quiet", "--threads", "1"])
    err = capsys.readouterr().err
    monkeypatch.undo()
    assert not marker.exists()
    assert closed[:3] == [EXTRA_FILE, MODEL_STATES, OPTIM_STATES], closed
    assert status == 0, err
    assert ("falling back to the previous one" in err) == (nth < 3), err
    if command == "export":
        if nth < 3:
            assert main(["export", str(runs / "zero2"), "--checkpoint", "previous", "--output",
                         str(tmp_path / "reference")]) == 0
        reference = runs / "zero2" / "model" if nth == 3 else tmp_path / "reference"
        got, want = (load_file(folder / "model.safetensors") for folder in (tmp_path / "exported", reference))
        assert got.keys() == want.keys()
        for key, value in want.items():
            torch.testing.assert_close(got[key], value, rtol=0, atol=0, msg=key)
    else:
        assert read_checked(run / "last.ds" / EXTRA_FILE)["step"] == 3


@pytest.mark.parametrize("what", ["partition", "extra"])
def test_a_link_in_last_ds_is_refused_naming_it(runs, tmp_path, capsys, what):
    """A listed file that is a symbolic link to a file outside the run (whoever can write that one could swap it):
    refused by name, exit 2 without previous.ds; nothing read through it."""
    marker = tmp_path / "ran"
    run = _copy(runs, tmp_path)
    linked = run / "last.ds" / (TAG + "/" + OPTIM_STATES if what == "partition" else EXTRA_FILE)
    outside = tmp_path / "shared-tmp" / linked.name
    outside.parent.mkdir()
    shutil.copy(linked, outside)
    if what == "partition":
        _plant(outside, marker)
    linked.unlink()
    linked.symlink_to(outside)
    shutil.rmtree(run / "previous.ds")
    status = _main(["eval", str(run)])
    err = capsys.readouterr().err
    assert not marker.exists()
    assert status == errors.USAGE
    lines = [line for line in err.splitlines() if line.strip() and "warning" not in line.lower()]
    assert lines[-1].startswith("gradcache: ") and str(linked) in lines[-1] and "symbolic link" in lines[-1], err


@pytest.mark.parametrize("graph", ["nested pairs", "holding itself"])
def test_a_list_bomb_in_extra_pt_ends_at_once_falling_back_or_exiting_2(runs, tmp_path, capsys, graph):
    """The 450-byte `[a, a]` x64 list (2**64 leaves to a walk that follows every reference) and a list holding
    itself, in last.ds's extra.pt signed by the current method: previous.ds is evaluated with a warning; without
    it, exit 2 in one line naming extra.pt; within 60 s, no traceback."""
    import time

    from tests.train.checkpoints.test_hostile_checksums import _holding_itself, _nested_pairs, _signed

    run = _copy(runs, tmp_path)
    extra = read_checked(run / "last.ds" / EXTRA_FILE)
    bomb = _nested_pairs(64) if graph == "nested pairs" else _holding_itself()
    torch.save(_signed({**extra, "junk": bomb}, 2), run / "last.ds" / EXTRA_FILE)
    capsys.readouterr()
    start = time.monotonic()
    assert _main(["eval", str(run)]) == 0
    err = capsys.readouterr().err
    assert "falling back to the previous one" in err and "extra.pt" in err and "Traceback" not in err
    shutil.rmtree(run / "previous.ds")
    assert _main(["eval", str(run)]) == errors.USAGE
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and str(run / "last.ds" / EXTRA_FILE) in lines[0], lines
    assert time.monotonic() - start < 60
