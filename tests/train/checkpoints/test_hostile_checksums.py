"""Checksums and loads bounded (issue 49 items 1 and 2, corpus of item 7): a planted object graph or tensor view
cannot make `gradcache eval` walk forever, recurse until a traceback, or allocate what the view pretends to hold;
and a last.pt that is a link or no regular file is refused by name. Each case plants its file into a copy of one
tiny SimCLR run (last.pt at step 2, previous.pt at step 1, built once), runs `gradcache eval` on it, and names the
status by docs/outputs.md's table, the time it must end within, and a fragment of its message: with previous.pt
there, the run falls back to it (exit 0, a warning naming last.pt); without, it exits 2 naming last.pt.

The reference of every fallback is the same eval of previous.pt given by path; of every load, the clean run's."""
from __future__ import annotations

import io
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from gradcache.cli import main
from gradcache.train.checkpoints.atomic import read_checked, save_checkpoint
from gradcache.train.checkpoints.checksum import CHECKSUM_KEY, VERSION_KEY, content_sha256
from gradcache.train.checkpoints.state_bounds import MAX_DEPTH
from gradcache.train.errors import CheckpointError
from tests.train.test_hostile_corpus import statuses


def _nested_pairs(levels: int) -> list:
    """`[a, a]` nested `levels` times: a pickle of a few hundred bytes, 2**levels leaves to a naive walk."""
    graph: list = []
    for _ in range(levels):
        graph = [graph, graph]
    return graph


def _holding_itself() -> list:
    graph: list = []
    graph.append(graph)
    return graph


def _signed(state: dict, version: int | None) -> dict:
    """`state` signed as a careful forger would: version 2 (the current method), 1 (the method of files written
    before it: no version key) or None (no checksum at all, as files older than checksums)."""
    state = {k: v for k, v in state.items() if k not in (CHECKSUM_KEY, VERSION_KEY)}
    if version == 2:
        return {**state, CHECKSUM_KEY: content_sha256(state), VERSION_KEY: 2}
    if version == 1:
        return {**state, CHECKSUM_KEY: "0" * 64}  # the forger cannot compute it: the walk never ends
    return state


def _planted(value: object, version: int | None) -> Callable[[Path], None]:
    def plant(path: Path) -> None:
        state = torch.load(path, weights_only=True)
        torch.save(_signed({**state, "junk": value}, version), path)
    return plant


def _small_file(value: object) -> Callable[[Path], None]:
    """last.pt replaced by a file holding `value` alone (the 450-byte bomb of issue 49)."""
    def plant(path: Path) -> None:
        torch.save({"junk": value}, path)
    return plant


def _past_storage(path: Path) -> None:
    """A tensor of 4 floats at offset 3 of a storage of 4: the offset edited in the pickle."""
    buffer = io.BytesIO()
    torch.save({"args": {}, "model": {"w": torch.zeros(4)}}, buffer)
    data = buffer.getvalue()
    assert data.count(b"QK\x00K\x04") == 1  # persistent storage id, offset 0, size (4,)
    path.write_bytes(data.replace(b"QK\x00K\x04", b"QK\x03K\x04"))


def _link(path: Path) -> None:
    outside = path.parent.parent / "elsewhere.pt"
    shutil.copy(path, outside)
    path.unlink()
    path.symlink_to(outside)


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


@dataclass(frozen=True)
class Case:
    name: str
    plant: Callable[[Path], None]
    fragment: str  # in the one-line refusal (no previous.pt) and in the fallback's warning
    seconds: float = 30.0  # the bound on `gradcache eval`, both ways (a generous one: the machine is shared)


CASES = [
    Case("nested-pairs-64-file", _small_file(_nested_pairs(64)), f"nested more than {MAX_DEPTH} deep"),
    Case("nested-pairs-64-signed", _planted(_nested_pairs(64), 2), f"nested more than {MAX_DEPTH} deep"),
    Case("nested-pairs-30-signed", _planted(_nested_pairs(30), 2), "entries when each shared one is counted"),
    Case("nested-pairs-30-old-sum", _planted(_nested_pairs(30), 1), "entries when each shared one is counted"),
    Case("holding-itself", _planted(_holding_itself(), 2), "a list that holds itself"),
    Case("holding-itself-no-sum", _planted(_holding_itself(), None), "a list that holds itself"),
    Case("expand-2**40-old-sum", _planted(torch.zeros(1).expand(2**40), 1), "an expanded tensor of shape"),
    Case("expand-2**28-unsigned", _planted(torch.zeros(1).expand(2**28), None), "an expanded tensor of shape"),
    Case("view-past-storage", _past_storage, "truncated or damaged"),
    Case("symlink", _link, "is a symbolic link"),
    Case("fifo", _fifo, "is not a regular file"),
]


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_args_module):
    root = tmp_path_factory.mktemp("hostile_checksums")
    assert main(tiny_args_module("simclr", root / "run", "--steps", "2", "--checkpoint-every", "1",
                                 "--eval-every", "0", "--threads", "1")) == 0
    return root / "run"


@pytest.fixture(scope="module")
def tiny_args_module():
    from tests.train.conftest import TINY

    return lambda mode, output_dir, *extra: ["train", mode, *TINY[mode], "--output-dir", str(output_dir), *extra]


def _eval(argv: list[str], capsys) -> tuple[int, dict | None, str, float]:
    start = time.monotonic()
    status = main(argv)
    seconds = time.monotonic() - start
    captured = capsys.readouterr()
    return status, json.loads(captured.out) if status == 0 else None, captured.err, seconds


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_each_planted_file_is_refused_by_name_in_well_under_a_second(case, tmp_path):
    """The quick loop's share: the same planted files in a small checkpoint, read as every command reads one."""
    path = tmp_path / "run" / "last.pt"
    save_checkpoint({"args": {"mode": "simclr"}, "model": {"w": torch.ones(3)}, "step": 1}, path)
    case.plant(path)
    start = time.monotonic()
    with pytest.raises(CheckpointError) as refused:
        read_checked(path)
    assert time.monotonic() - start < 1.0
    assert case.fragment in str(refused.value) and "last.pt" in str(refused.value)


@pytest.mark.slow  # a tiny run, then an eval per case
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_planted_last_pt_falls_back_to_previous_or_exits_2_naming_it(case, run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    case.plant(copy / "last.pt")
    reference = _eval(["eval", str(run / "previous.pt")], capsys)[1]

    status, metrics, err, seconds = _eval(["eval", str(copy)], capsys)
    assert status == statuses()["OK"], err
    assert seconds < case.seconds
    assert metrics == reference  # previous.pt's, as given by path
    assert "Traceback" not in err and f"{copy / 'last.pt'}" in err and case.fragment in err
    assert "falling back to the previous one" in err

    (copy / "previous.pt").unlink()
    status, _, err, seconds = _eval(["eval", str(copy)], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == statuses()["USAGE"] and seconds < case.seconds
    assert len(lines) == 1 and lines[0].startswith("gradcache: ") and case.fragment in lines[0], err
    assert "last.pt" in lines[0]


@pytest.mark.slow
def test_a_stride_0_view_signed_by_the_current_method_is_hashed_by_its_storage(run, tmp_path, capsys,
                                                                               monkeypatch):
    """`zeros(1).expand(2**28)` (1 GiB as a contiguous copy) in a 23 KB file: the checksum feeds its 4 bytes of
    storage with its shape and strides; no contiguous copy of more than a million elements is made anywhere in
    the load (the guard raises on one), and the eval is the clean run's, the extra entry ignored. Its 2**40 twin
    too."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    clean = _eval(["eval", str(run)], capsys)[1]
    contiguous = torch.Tensor.contiguous

    def guarded(self, *args, **kwargs):
        assert self.numel() <= 10**6 or self.is_contiguous(), f"a contiguous copy of {tuple(self.shape)}"
        return contiguous(self, *args, **kwargs)

    for size in (2**28, 2**40):
        _planted(torch.zeros(1).expand(size), 2)(copy / "last.pt")
        assert (copy / "last.pt").stat().st_size < 10**6
        monkeypatch.setattr(torch.Tensor, "contiguous", guarded)
        status, metrics, err, seconds = _eval(["eval", str(copy)], capsys)
        monkeypatch.undo()
        assert status == 0, err
        assert metrics == clean and "falling back" not in err and seconds < 30


@pytest.mark.slow
def test_a_checkpoint_signed_by_the_version_1_method_still_loads(run, tmp_path, capsys):
    """A last.pt written before checksum version 2 (no version key, the sum of the old walk) loads as it did: the
    eval equals the clean one's; a flipped value in it fails its version-1 checksum."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    state = torch.load(copy / "last.pt", weights_only=True)
    content = {k: v for k, v in state.items() if k not in (CHECKSUM_KEY, VERSION_KEY)}
    torch.save({**content, CHECKSUM_KEY: content_sha256(content, 1)}, copy / "last.pt")
    assert VERSION_KEY not in torch.load(copy / "last.pt", weights_only=True)
    assert read_checked(copy / "last.pt")["step"] == 2
    assert _eval(["eval", str(copy)], capsys)[1] == _eval(["eval", str(run)], capsys)[1]
    torch.save({**content, "step": 3, CHECKSUM_KEY: content_sha256(content, 1)}, copy / "last.pt")
    status, _, err, _ = _eval(["eval", str(copy / "last.pt")], capsys)
    assert status == 2 and "fails its checksum" in err


def test_version_2_hashes_a_stride_0_view_by_its_storage_without_a_copy(monkeypatch):
    """`zeros(1).expand(2**28)` and `(2**40)`: no contiguous copy is asked for (a guard fails one), the work is
    the 4 bytes of storage; the shape and strides still count."""
    def refuse(self, *args, **kwargs):
        raise AssertionError(f"a contiguous copy of {tuple(self.shape)}")

    monkeypatch.setattr(torch.Tensor, "contiguous", refuse)
    start = time.monotonic()
    digests = {content_sha256({"t": torch.zeros(1).expand(size)}) for size in (2**28, 2**40, 2)}
    assert len(digests) == 3 and time.monotonic() - start < 1.0


def test_version_2_feeds_a_shared_object_once_and_tells_sharing_apart():
    """The same values shared or not hash apart (the sharing is part of what a load rebuilds), each stable; a
    tensor's storage, strides and offset count: a view of another part of the same storage differs."""
    a = [1, "x" * 100]
    shared, unshared = {"l": [a, a]}, {"l": [a, list(a)]}
    assert content_sha256(shared) == content_sha256({"l": [a, a]})
    assert content_sha256(shared) != content_sha256(unshared)
    storage = torch.arange(6.0)
    assert content_sha256({"t": storage[:3]}) != content_sha256({"t": storage[3:]})
    assert content_sha256({"t": storage[:3]}) != content_sha256({"t": storage[:3].clone()})
    assert content_sha256({"t": storage.view(2, 3)}) != content_sha256({"t": storage.view(2, 3).t()})
    assert content_sha256({"n": 2**20000}) != content_sha256({"n": 2**20000 + 1})  # past int's 4,300 digits
