"""Smoke tests of benchmarks/llm_recipe.py at tiny sizes: the sweep measures and times every strategy on a decoder
it builds, GradCache and FullBatch see the same loss, the tokenizer it builds knows its texts; the GPU form's
options and memory arithmetic, checked against a real model's parameters and peft's adapter, without a GPU."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402
import transformers  # noqa: E402

from benchmarks import llm_recipe as bench  # noqa: E402
from benchmarks.fresh_process import run_point  # noqa: E402

TINY = ["--hidden", "16", "--layers", "1", "--heads", "2", "--intermediate", "32", "--vocab", "300",
        "--chunk", "2", "--chunk-tokens", "24", "--max-length", "20", "--query-words", "2,4",
        "--passage-words", "3,10", "--rounds", "1", "--threads", "1", "--lora-rank", "2"]


def _in_process(module: str, point: dict, time_budget_s: float | None, env: dict | None = None) -> dict:
    """The child's work without the child: same measuring code, in this process, to keep the test fast."""
    return bench.run_one_point(point)


def test_sweep_measures_and_times_every_strategy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "run_point", _in_process)
    rows = bench.main(["--batches", "6", *TINY, "--output-dir", str(tmp_path)])
    assert [row["strategy"] for row in rows] == list(bench.STRATEGIES)
    assert all(row["status"] == "ok" and row["step_s"] > 0 and row["peak_mb"] >= 0 for row in rows)
    parameters = bench.decoder_parameters(16, 1, 2, 2, 32, 300) + bench.lora_parameters(16, 1, 2, 2, 32, rank=2)
    assert rows[0]["weights_mb"] * bench.MB == parameters * 4  # fp32 on CPU
    by_name = {row["strategy"]: row for row in rows}
    assert by_name["naive"]["ratio_to_naive"] == 1.0
    # Same weights, same batch: GradCache's loss is the full batch's (bf16 autocast), accumulation's is not.
    assert by_name["gradcache"]["loss_value"] == pytest.approx(by_name["full_batch"]["loss_value"], rel=2e-2)
    assert by_name["gradcache"]["trained_parameters"] == bench.lora_parameters(16, 1, 2, 2, 32, rank=2)
    written = json.loads((tmp_path / "llm_recipe.json").read_text())
    assert len(written["rows"]) == 3 and written["settings"]["chunk_tokens"] == 24
    assert (tmp_path / "llm_recipe.png").stat().st_size > 0


def test_built_tokenizer_knows_the_texts_and_prompt(tmp_path: Path) -> None:
    from gradcache.models import HuggingFaceTokenizer

    words = bench.write_tokenizer(tmp_path, 200)
    assert len(set(words)) == len(words) == 200 - len(bench.SPECIAL) - len(bench.prompt_words())
    queries, passages = bench.texts(5, words, (2, 4), (3, 30))
    tokenize = HuggingFaceTokenizer(tmp_path, max_length=64)
    query_ids = tokenize(queries, prompt=bench.QUERY_PROMPT)["input_ids"]
    passage_ids = tokenize(passages)["input_ids"]
    unknown = tokenize.tokenizer.unk_token_id
    assert not (query_ids == unknown).any() and not (passage_ids == unknown).any()
    eos = tokenize.tokenizer.eos_token_id
    assert [ids[ids != 0][-1].item() for ids in passage_ids] == [eos] * 5  # the pooled token


def test_arithmetic_counts_a_real_decoder_and_peft_adapter() -> None:
    from peft import LoraConfig, get_peft_model

    sizes = dict(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=48)
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaModel(config)
    assert bench.decoder_parameters(vocab=100, **sizes) == sum(p.numel() for p in model.parameters())
    adapted = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=bench.LORA_TARGETS))
    trainable = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert bench.lora_parameters(rank=4, **sizes) == trainable


def test_plan_of_a_7b_folder_fits_one_gpu(tmp_path: Path) -> None:
    # Mistral-7B's published sizes; the folder holds its config alone (no weights are read).
    transformers.MistralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                               num_attention_heads=32, num_key_value_heads=8).save_pretrained(tmp_path)
    plan = bench.plan_of_folder(str(tmp_path), rank=16, batch=2048, chunk_tokens=8192)
    assert plan["base_parameters"] + 32000 * 4096 == 7_241_732_096  # with its LM head: Mistral-7B's count
    assert plan["weights"] == pytest.approx(2 * plan["base_parameters"] / 1e9)
    assert plan["cache"] == pytest.approx(4 * 2048 * 4096 * 4 / 1e9)
    parts = ("weights", "lora_states", "checkpoints", "one_layer", "cache", "loss")
    assert plan["total"] == pytest.approx(sum(plan[name] for name in parts))
    assert 14 < plan["weights"] < plan["total"] < 80  # an H100's 80 GB
    fp32 = bench.memory_plan(4096, 32, 32, 8, 14336, 32000, weight_bytes=4)  # the program: autocast, fp32 weights
    assert fp32["weights"] == pytest.approx(2 * plan["weights"])
    assert fp32["total"] - plan["total"] == pytest.approx(plan["weights"])


def test_gpu_form_options(tmp_path: Path) -> None:
    parser = bench.get_args_parser()
    with pytest.raises(SystemExit) as exit_info:
        bench.resolve_args(parser.parse_args(["--gpu"]), parser)
    assert exit_info.value.code == 2
    args = bench.resolve_args(parser.parse_args(["--gpu", "--model", str(tmp_path)]), parser)
    assert (args.device, args.batch_list, args.strategy_list, args.chunk, args.chunk_tokens, args.max_length) == (
        "cuda", [2048], ["gradcache", "naive"], 64, 8192, 512)
    point = bench.point_of(args, str(tmp_path), "gradcache", 2048)
    assert point["bf16_weights"] and point["device"] == "cuda"


@pytest.mark.parametrize("argv", [["--strategies", "gradcache,deepspeed"], ["--batches", "1"], ["--chunk", "-1"],
                                  ["--passage-words", "9,3"], ["--batches", "a,b"]])
def test_bad_options_exit_2(argv: list[str]) -> None:
    parser = bench.get_args_parser()
    with pytest.raises(SystemExit) as exit_info:
        bench.resolve_args(parser.parse_args(argv), parser)
    assert exit_info.value.code == 2


@pytest.mark.slow
def test_a_point_runs_in_a_fresh_process(tmp_path: Path) -> None:
    folder = bench.write_decoder(tmp_path / "decoder", hidden=16, layers=1, heads=2, intermediate=32, vocab=300)
    point = {"model": str(folder), "strategy": "gradcache", "batch": 4, "chunk": 2, "chunk_tokens": 24,
             "max_length": 20, "query_words": [2, 4], "passage_words": [3, 10], "lora_rank": 2, "autocast": "bf16",
             "bf16_weights": False, "threads": 1, "device": "cpu", "memory_budget_gb": 4.0}
    result = run_point(bench.__spec__.name, point, time_budget_s=300)
    assert result["status"] == "ok", result
    assert result["peak_mb"] >= 0 and torch.isfinite(torch.tensor(result["loss_value"]))
