"""Out of memory or disk while the data is read or indexed: one line, exit 4 (memory) or 74 (disk), and no run
folder left behind (a new one is removed again; a resumed one keeps its checkpoints)."""
import errno
import json

import pytest

from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.data.text import row_index
from gradcache.train.modes import MODES
from tests.train.conftest import text_args


def _rows(path, count=40):
    path.write_text("".join(json.dumps({"query": f"question {i}", "positive": f"answer {i}"}) + "\n"
                            for i in range(count)))
    return path


def _one_line(capsys):
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("mode", ["simclr", "clip"])
def test_running_out_of_memory_loading_images_exits_4_and_leaves_no_folder(tmp_path, tiny_args, monkeypatch, capsys,
                                                                           mode):
    def exhausted(self, config):
        raise MemoryError

    monkeypatch.setattr(type(MODES[mode]), "load_data", exhausted)
    out = tmp_path / "new" / "run"
    assert main(tiny_args(mode, out)) == errors.DATA_ERROR
    assert "ran out of memory while loading --data" in _one_line(capsys)
    assert not (tmp_path / "new").exists()


def test_running_out_of_memory_indexing_text_exits_4_and_leaves_no_folder(tmp_path, tiny_bert, monkeypatch, capsys):
    data = _rows(tmp_path / "rows.jsonl")
    original = row_index.RowIndex.__init__

    def exhausted(self, *args, **kwargs):  # the index built, its array too large to keep
        original(self, *args, **kwargs)
        raise MemoryError

    monkeypatch.setattr(row_index.RowIndex, "__init__", exhausted)
    out = tmp_path / "run"
    assert main(text_args(tiny_bert, out, "--data", str(data))) == errors.DATA_ERROR
    assert f"--data {data}" in _one_line(capsys)
    assert not out.exists()


def test_a_disk_too_full_for_the_row_index_exits_74_and_leaves_no_folder(tmp_path, tiny_bert, monkeypatch, capsys):
    data = _rows(tmp_path / "rows.jsonl")
    written = []

    def full(handle, **arrays):
        handle.write(b"part of an index")  # a partial file exists when the disk fills
        written.append(handle.name)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(row_index.np, "savez", full)
    out = tmp_path / "run"
    assert main(text_args(tiny_bert, out, "--data", str(data))) == errors.DISK_FULL
    assert "no space left to save the data's row index" in _one_line(capsys)
    assert written and not out.exists()  # the partial file removed, then the folder the run created


def test_a_full_disk_on_a_resume_keeps_the_run(tmp_path, tiny_bert, monkeypatch, capsys):
    """The run folder existed before: it keeps its checkpoint and logs; the stale index is not replaced by a
    partial one."""
    data = _rows(tmp_path / "rows.jsonl")
    out = tmp_path / "run"
    assert main(text_args(tiny_bert, out, "--data", str(data), "--steps", "2")) == 0
    before = sorted(path.name for path in out.iterdir())
    capsys.readouterr()
    data.write_text(data.read_text() + json.dumps({"query": "q", "positive": "p"}) + "\n")

    def full(handle, **arrays):  # the file changed: the index is built again and saved, on a full disk
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(row_index.np, "savez", full)
    assert main(["train", "text", "--resume", str(out), "--steps", "3", "--quiet"]) == errors.DISK_FULL
    _one_line(capsys)
    assert sorted(path.name for path in out.iterdir()) == before
