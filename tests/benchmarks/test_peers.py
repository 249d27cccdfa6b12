"""Smoke tests of benchmarks/peers.py at tiny sizes: our sides always measure, a peer's side measures where the
peer is installed and is recorded as skipped where it is not; the CSV has its columns and the PNG is written."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from benchmarks import peers as bench
from benchmarks.peer_steps import CLIP_SIDES, TEXT_SIDES

TINY = {"text_length": 6, "text_width": 16, "text_layers": 1, "embed_dim": 8, "tile_size": 4, "steps": 1,
        "warmup": 0, "threads": 0, "device": "cpu", "memory_budget_gb": 0}
TINY_FLAGS = ["--batch", "8", "--mini-batch", "4", "--text-length", "6", "--text-width", "16", "--text-layers", "1",
              "--min-pairs", "8", "--max-pairs", "16", "--embed-dim", "8", "--tile-size", "4", "--steps", "1",
              "--warmup", "0", "--threads", "0", "--memory-budget-gb", "0"]


def _in_process(module: str, point: dict, time_budget_s: float | None) -> dict:
    """The child's measuring code in this process, to keep the test fast."""
    return bench.measure_point(point)


def test_sweep_writes_csv_columns_and_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_csv) -> None:
    monkeypatch.setattr(bench, "run_point", _in_process)
    assert bench.main([*TINY_FLAGS, "--output-dir", str(tmp_path), "--name", "peers"]) == 0
    header, rows = read_csv(tmp_path / "peers.csv")
    assert header == bench.COLUMNS
    assert [row["side"] for row in rows] == [*TEXT_SIDES, *CLIP_SIDES, *CLIP_SIDES]
    for row in rows:
        installed = bench.PEER_PACKAGES.get(row["side"]) is None or bench.peer_version(row["side"]) is not None
        assert (row["status"] == "ok") == installed, row
        if row["side"] in bench.PEER_PACKAGES and installed:
            assert row["peer_version"] == bench.peer_version(row["side"])
    assert (tmp_path / "peers_clip_loss.png").stat().st_size > 0


def test_a_missing_peer_is_skipped_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(bench, "run_point", _in_process)
    monkeypatch.setitem(bench.PEER_PACKAGES, "open_clip", "no-such-package-for-gradcache-tests")
    assert bench.main([*TINY_FLAGS, "--max-pairs", "8", "--output-dir", str(tmp_path)]) == 0
    assert "skipped comparisons: open_clip" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None,
                    reason="the optional extra 'peers' (sentence-transformers) is not installed")
def test_sentence_transformers_side_trains_the_same_encoder() -> None:
    result = bench.measure_point({**TINY, "comparison": "cached_text_step", "side": "st_cached_mnrl",
                                  "batch": 8, "mini_batch": 4})
    assert result["status"] == "ok" and result["step_s"] > 0
