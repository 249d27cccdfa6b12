"""One job per run folder: while a job holds a folder's lock, a second one exits 2 at once naming the holder;
the lock goes with the holder's process, however it ends (SIGKILL included)."""
import os
import signal
import socket
import subprocess
import sys

import pytest

from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.run_folder.lock import RunFolderLock
from tests.multiprocess import run_on_ranks

HOLD = ("import sys, time; from gradcache.train.run_folder.lock import RunFolderLock; "
        "lock = RunFolderLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(600)")


def test_a_second_job_on_a_locked_folder_exits_2_naming_the_holder(tmp_path, tiny_args, capsys):
    assert main(tiny_args("simclr", tmp_path)) == 0
    before = (tmp_path / "train_log.csv").read_bytes()
    with RunFolderLock(tmp_path).acquire():  # a job running in the folder
        for argv in (["train", "simclr", "--resume", str(tmp_path)],
                     tiny_args("simclr", tmp_path, "--resume", "auto")):
            assert main(argv) == errors.USAGE
            err = capsys.readouterr().err
            assert f"run folder {tmp_path} is in use by another job (pid {os.getpid()} on host " \
                   f"{socket.gethostname()}, since " in err
    assert (tmp_path / "train_log.csv").read_bytes() == before
    assert main(["train", "simclr", "--resume", str(tmp_path), "--quiet"]) == 0  # released: the folder is free


@pytest.mark.slow
def test_the_lock_dies_with_its_holder(tmp_path, tiny_args, capsys):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(tiny_args("simclr", tmp_path)) == errors.USAGE
        assert f"(pid {holder.pid} on host" in capsys.readouterr().err
        assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]  # the second job wrote nothing
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert main(tiny_args("simclr", tmp_path)) == 0


def _train_on_rank(rank: int, world_size: int, argv: list[str]) -> int:
    return main(argv)


def test_every_rank_of_a_group_exits_2_when_rank_0_finds_the_folder_locked(tmp_path, tiny_args):
    """Rank 0 takes the lock and tells the others: none of them waits for a rank that gave up."""
    with RunFolderLock(tmp_path).acquire():
        assert run_on_ranks(_train_on_rank, 2, tiny_args("simclr", tmp_path, "--threads", "1")) == [2, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]


def _no_write_permission(monkeypatch, folder):
    """As a folder without write permission behaves for a user other than root (the tests run as root, whom the
    permission bits do not stop): creating a file in it fails with EACCES."""
    import builtins
    import errno

    from gradcache.train.run_folder import lock as lock_module

    def refused(path, *args, **kwargs):
        if os.path.dirname(os.path.abspath(path)) == str(folder):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(lock_module, "open", refused, raising=False)


@pytest.mark.parametrize("where", ["read-only folder", "under a file", "under /proc"])
def test_an_output_dir_that_cannot_be_written_exits_2_naming_it(tmp_path, tiny_args, capsys, monkeypatch, where):
    if where == "read-only folder":
        output = tmp_path / "read-only"
        output.mkdir()
        _no_write_permission(monkeypatch, output)
    elif where == "under a file":
        (tmp_path / "a-file").write_text("not a folder")
        output = tmp_path / "a-file" / "run"
    else:
        output = "/proc/gradcache-run"
    assert main(tiny_args("simclr", output)) == errors.USAGE
    err = capsys.readouterr().err
    assert f"--output-dir {output}" in err and "cannot be written" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == (["a-file"] if where == "under a file" else
                                                           ["read-only"] if where == "read-only folder" else [])


@pytest.mark.parametrize("at", ["the folder", "the lock file"])
def test_a_full_disk_at_the_start_exits_74_naming_the_folder_and_leaves_nothing(tmp_path, tiny_args, capsys,
                                                                                monkeypatch, at):
    import builtins
    import errno
    from pathlib import Path

    from gradcache.cli import main
    from gradcache.train.run_folder import lock as lock_module

    output = tmp_path / "runs" / "new"
    if at == "the folder":
        def full(self, *args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device", str(self))

        monkeypatch.setattr(Path, "mkdir", full)
    else:
        def full(path, *args, **kwargs):
            if str(path).endswith(".lock"):
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            return builtins.open(path, *args, **kwargs)

        monkeypatch.setattr(lock_module, "open", full, raising=False)
    assert main(tiny_args("simclr", output)) == 74
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no space left to create the run folder" in err and str(output) in err
    monkeypatch.undo()
    assert not (tmp_path / "runs").exists()
