"""`gradcache bench ...` (gradcache/bench.py): the sub-commands reach the checkout's scripts with their own
arguments, and a checkout without the scripts exits 2 with a message."""
from __future__ import annotations

from pathlib import Path

import pytest

from gradcache import bench
from gradcache.cli import main


def _run(argv: list[str]) -> int:
    """Through the installed CLI's entry point, as `gradcache bench ...` runs."""
    return main(argv)


def test_every_benchmark_script_is_found_in_the_checkout() -> None:
    for filename, _ in bench.SCRIPTS.values():
        assert (bench.benchmarks_dir() / filename).is_file()


def test_script_options_pass_through_to_the_script(tmp_path: Path, read_csv) -> None:
    argv = ["bench", "quality", "--batches", "4", "--chunk", "2", "--steps", "1", "--strategies", "gradcache",
            "--train-size", "8", "--test-size", "8", "--width", "8", "--image-size", "16", "--knn-k", "2",
            "--threads", "0", "--output-dir", str(tmp_path), "--name", "via_cli"]
    assert _run(argv) == 0
    _, rows = read_csv(tmp_path / "via_cli.csv")
    assert {(row["strategy"], row["batch"], row["chunk"]) for row in rows} == {("gradcache", "4", "2")}


def test_script_help_and_bad_options_exit_like_the_script(capsys) -> None:
    assert _run(["bench", "peers", "--help"]) == 0
    assert "--mini-batch" in capsys.readouterr().out
    assert _run(["bench", "quality", "--no-such-option"]) == 2


def test_missing_scripts_exit_2_with_a_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(bench, "benchmarks_dir", lambda: tmp_path)
    assert _run(["bench", "memory"]) == 2
    assert "ship with the source checkout" in capsys.readouterr().err
    assert _run(["bench"]) == 2
