"""Smoke tests of benchmarks/frontier.py at tiny sizes on the CPU (benchmarks/gpu: test_gpu.py)."""
from __future__ import annotations

from pathlib import Path

import torch

from benchmarks import frontier
from benchmarks.frontier_workloads import (BUDGET_FRACTIONS, GRAPHS_KEPT, _accumulation_graphs_kept, build_steps,
                                          sentences)
from gradcache import NaiveAccumulation, losses

TINY = {"workload": "simclr", "batch": 8, "chunk": 4, "chunk_tokens": None, "image_size": 8, "max_length": 32,
        "threads": 0, "device": "cpu", "memory_budget_gb": 0, "config": "budget_50"}


def test_frontier_times_every_configuration_round_robin_and_writes_csv_and_png(tmp_path: Path, read_csv) -> None:
    flags = ["--workload", "simclr", "--batch", "8", "--chunk", "4", "--image-size", "8", "--rounds", "1",
             "--threads", "0", "--only", "time", "--configs", "full_batch,naive,budget_100",
             "--output-dir", str(tmp_path)]
    assert frontier.main(flags) == 0
    header, rows = read_csv(tmp_path / "frontier_simclr.csv")
    assert header == frontier.COLUMNS
    assert [row["config"] for row in rows] == ["full_batch", "naive", "budget_100"]
    assert all(float(row["step_s"]) > 0 and row["loadavg_1m"] for row in rows)
    assert (tmp_path / "frontier_simclr.png").stat().st_size > 0


def test_a_memory_point_builds_only_its_configuration_and_measures() -> None:
    steps, info = build_steps(TINY, torch.device("cpu"), only="budget_50")
    assert list(steps) == ["budget_50"] and info["budget_50"]["kept_fraction"] == 0.5
    everything, _ = build_steps(TINY, torch.device("cpu"))
    assert set(everything) == {"nograd_forward", "full_batch", "naive", GRAPHS_KEPT,
                               *(f"budget_{round(f * 100)}" for f in BUDGET_FRACTIONS)}
    result = frontier.memory_point(TINY)
    assert result["status"] == "ok" and result["peak_mb"] >= 0


def test_accumulation_with_every_graph_kept_gives_naive_accumulations_gradient() -> None:
    torch.manual_seed(0)
    encoder = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    loss = losses.ClipLoss()  # a learnable logit scale: a loss parameter
    views = (torch.randn(10, 6), torch.randn(10, 6))  # an uneven last micro-batch
    parameters = [*encoder.parameters(), *loss.parameters()]
    NaiveAccumulation(encoder, loss, 4).step(*views)
    expected = [p.grad.clone() for p in parameters]
    for p in parameters:
        p.grad = None
    _accumulation_graphs_kept(NaiveAccumulation(encoder, loss, 4), views)()
    for p, g in zip(parameters, expected):
        torch.testing.assert_close(p.grad, g)


def test_text_sentences_are_long_tailed() -> None:
    texts = sentences(200)
    words = sorted(len(t.split()) for t in texts)
    assert len(set(texts)) > 100 and all(w >= 4 for w in words)
    assert words[-10] > 3 * words[100]  # the longest tenth, several times the median


def test_text_configurations_include_token_chunks_and_the_peer() -> None:
    settings = {**TINY, "workload": "text", "batch": 4, "chunk": 2}
    steps, info = build_steps(settings, torch.device("cpu"), only="chunk_tokens")
    assert list(steps) == ["chunk_tokens"] and info["chunk_tokens"]["chunk_tokens"] >= 1
    steps["chunk_tokens"]()
    assert {"st_cached", "st_cached_tokens"} <= set(info)


def test_labels_of_points_close_together_get_distinct_places() -> None:
    points = [{"peak_mb": 985.0, "step_s": 14.8}, {"peak_mb": 1140.0, "step_s": 14.7},
              {"peak_mb": 985.0, "step_s": 14.5}, {"peak_mb": 5091.0, "step_s": 22.8}]
    offsets = frontier._label_offsets(points)
    assert len(set(offsets[:3])) == 3 and offsets[3] == (4, 4, "left")  # the far point keeps the default
    assert frontier._label_offsets([]) == []
