"""Smoke tests of benchmarks/llm_recipe.py at tiny sizes: the sweep measures and times every strategy on a decoder
it builds, GradCache and FullBatch see the same loss, the tokenizer it builds knows its texts; `--shape tiny` runs
the named shapes' path (a decoder built in memory) and prints its plan first; the named shapes count what
transformers builds; the GPU form's options, its memory arithmetic (checked against a real model's parameters,
peft's adapter and the tensors autograd saves) and its budget, refused below the weights, all without a GPU."""
from __future__ import annotations

import json
import math
import re
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


@pytest.mark.slow
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
    assert bench.shape_of_folder(str(tmp_path)) == bench.SHAPES["mistral-7b"]
    plan = bench.plan_of_folder(str(tmp_path), rank=16, batch=2048, chunk_tokens=8192)
    assert plan["base_parameters"] + 32000 * 4096 == 7_241_732_096  # with its LM head: Mistral-7B's count
    assert plan["weights"] == pytest.approx(2 * plan["base_parameters"] / bench.GB)
    assert plan["cache"] == pytest.approx(4 * 2048 * 4096 * 4 / bench.GB)
    assert plan["total"] == pytest.approx(sum(plan[name] for name in bench.PARTS))
    assert plan["weights"] < plan["total"] < 78  # an H100's 78 GiB
    fp32 = bench.memory_plan(bench.SHAPES["mistral-7b"], weight_bytes=4)  # the program: autocast, fp32 weights
    assert fp32["weights"] == pytest.approx(2 * plan["weights"])
    assert fp32["checkpoints"] == pytest.approx(2 * plan["checkpoints"])  # the residual stream in fp32
    assert fp32["weight_copies"] > 0 == plan["weight_copies"]  # autocast's bf16 copies of the recomputed layer


@pytest.mark.parametrize("name", list(bench.SHAPES))
def test_named_shape_counts_what_transformers_builds(name: str) -> None:
    shape = bench.SHAPES[name]
    config = bench.decoder_config(shape)
    with torch.device("meta"):  # no memory
        causal = transformers.AutoModelForCausalLM.from_config(config)
        base = transformers.AutoModel.from_config(config)
    head = 0 if config.tie_word_embeddings else shape.vocab * shape.hidden  # tied: counted once, in the embedding
    counted = bench.decoder_parameters(**shape.sizes(), vocab=shape.vocab, qkv_bias=shape.qkv_bias)
    assert sum(p.numel() for p in causal.parameters()) == counted + head
    assert sum(p.numel() for p in base.parameters()) == counted == shape.parameters()
    assert type(config).__name__ == bench.FAMILIES[shape.family][0]


@pytest.mark.parametrize("autocast", [True, False])
def test_layer_bytes_count_what_autograd_saves(autocast: bool) -> None:
    # One layer's saved tensors, per token: the slope between 2 and 4 rows of the same length (constant parts, as
    # autocast's copies of the adapter's weights, cancel), counted by saved-tensor hooks, parameters left out.
    shape = bench.Shape("mistral", hidden=64, layers=2, heads=4, kv_heads=2, intermediate=160, vocab=300)
    rank, length = 4, 32
    torch.manual_seed(0)
    point = {"shape": bench.dataclasses.asdict(shape), "bf16_weights": False, "lora_rank": rank}
    encoder = bench.build_encoder(point, torch.device("cpu"))
    model = encoder.model.get_base_model()
    disable = getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable
    disable()  # the graph of a layer as checkpointing's recompute builds it
    parameters = {p.untyped_storage().data_ptr() for p in encoder.parameters()}

    def saved_in_layer_one(rows: int) -> int:
        storages: dict[int, int] = {}
        inside = [False]

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            if inside[0] and storage.data_ptr() not in parameters:
                storages[storage.data_ptr()] = storage.nbytes()
            return tensor
        layer = model.layers[1]
        hooks = [layer.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True)),
                 layer.register_forward_hook(lambda *_: inside.__setitem__(0, False))]
        ids = torch.randint(4, shape.vocab, (rows, length))
        mask = torch.ones(rows, length, dtype=torch.long)
        mask[0, length // 2:] = 0  # padding: SDPA gets a mask, as in the step
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                model(input_ids=ids, attention_mask=mask)
        for hook in hooks:
            hook.remove()
        return sum(storages.values())

    per_token = (saved_in_layer_one(4) - saved_in_layer_one(2)) / (2 * length)
    compute = 2 if autocast else 4
    planned = bench.layer_token_bytes(shape, rank, compute, mask_bytes=4) + length * compute  # CPU: fp32 masks
    assert planned == pytest.approx(per_token, rel=0.02)


def test_gpu_form_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = bench.get_args_parser()
    for argv in (["--gpu"], ["--gpu", "--model", str(tmp_path), "--shape", "tiny"],
                 ["--model", str(tmp_path), "--layers", "2"]):
        with pytest.raises(SystemExit) as exit_info:
            bench.resolve_args(parser.parse_args(argv), parser)
        assert exit_info.value.code == 2
    assert "--shape NAME" in capsys.readouterr().err
    args = bench.resolve_args(parser.parse_args(["--gpu", "--model", str(tmp_path)]), parser)
    assert (args.device, args.batch_list, args.strategy_list, args.chunk, args.chunk_tokens, args.max_length) == (
        "cuda", [2048], ["gradcache", "naive"], 64, 8192, 512)
    assert args.memory_budget_gb == bench.GPU_MEMORY_BUDGET_GB and args.built_shape is None
    point = bench.point_of(args, str(tmp_path), str(tmp_path), None, "gradcache", 2048)
    assert point["bf16_weights"] and point["device"] == "cuda" and point["shape"] is None
    args = bench.resolve_args(parser.parse_args(["--gpu", "--shape", "mistral-7b"]), parser)
    assert args.built_shape == bench.SHAPES["mistral-7b"]
    point = bench.point_of(args, None, str(tmp_path), args.built_shape, "gradcache", 2048)
    assert bench.Shape(**point["shape"]) == bench.SHAPES["mistral-7b"] and point["model"] is None
    # Sizes given beside a shape change it; multi-head attention stays multi-head.
    args = bench.resolve_args(parser.parse_args(["--shape", "mistral-7b", "--layers", "2"]), parser)
    assert args.built_shape == bench.dataclasses.replace(bench.SHAPES["mistral-7b"], layers=2)
    args = bench.resolve_args(parser.parse_args(["--heads", "2"]), parser)
    assert (args.built_shape.heads, args.built_shape.kv_heads, args.memory_budget_gb) == (
        2, 2, bench.CPU_MEMORY_BUDGET_GB)


def test_gpu_shape_budget_below_the_weights_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # Mistral-7B's bf16 weights alone, counted on the meta device, exceed the old default of 12 GiB.
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(bench.decoder_config(bench.SHAPES["mistral-7b"]))
    weights_gib = sum(p.numel() for p in model.parameters()) * 2 / bench.GB
    argv = ["--gpu", "--shape", "mistral-7b", "--batches", "4", "--plan-only"]
    with pytest.raises(SystemExit) as exit_info:
        bench.main([*argv, "--memory-budget-gb", "12"])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert "plan: 1 points" not in captured.out and "plan: 2 points" in captured.out  # printed, then refused
    message = " ".join(captured.err.split())
    assert "--memory-budget-gb 12 is below every point's planned peak" in message
    assert f"{weights_gib:.3g} of weights" in message
    smallest = float(re.search(r"Give --memory-budget-gb ([0-9.]+) or more", message).group(1))
    assert weights_gib < smallest <= math.ceil(weights_gib + 2)  # the weights, the adapter, a few rows' activations
    assert bench.main([*argv, "--memory-budget-gb", str(smallest)]) == []  # the smallest budget named is accepted


@pytest.mark.slow  # a sweep of two points and a round robin: 9 s
def test_shape_tiny_builds_in_memory_and_prints_the_plan_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench, "run_point", _in_process)
    built = []
    build_decoder = bench.build_decoder
    monkeypatch.setattr(bench, "build_decoder", lambda *a: built.append(a) or build_decoder(*a))
    monkeypatch.setattr(bench, "write_decoder", None)  # the shapes' path writes no decoder folder
    argv = ["--shape", "tiny", "--batches", "4", "--strategies", "gradcache,naive", "--chunk", "2",
            "--chunk-tokens", "24", "--max-length", "20", "--query-words", "2,4", "--passage-words", "3,10",
            "--rounds", "1", "--threads", "1", "--lora-rank", "2", "--output-dir", str(tmp_path)]
    rows = bench.main(argv)
    out = capsys.readouterr().out
    plan_line = re.search(r"^plan: 2 points, planned peak ([0-9.]+) GiB, ~([0-9]+) s", out, re.MULTILINE)
    assert plan_line and out.index(plan_line.group(0)) < out.index('{"strategy": "gradcache"')  # before point 1
    tiny = bench.SHAPES["tiny"]
    assert [a[0] for a in built] == [tiny] * 3 and {a[1] for a in built} == {torch.float32}  # 2 points, 1 timing
    assert all(row["status"] == "ok" and row["step_s"] > 0 for row in rows)
    parameters = tiny.parameters() + bench.lora_parameters(**tiny.sizes(), rank=2)
    assert rows[0]["weights_mb"] * bench.MB == parameters * 4  # the tiny shape, fp32 on CPU
    written = json.loads((tmp_path / "llm_recipe.json").read_text())
    planned = {(p["strategy"], p["batch"]): p for p in written["settings"]["plan"]}
    assert float(plan_line.group(1)) == pytest.approx(max(p["planned_gib"] for p in planned.values()), rel=1e-2)
    for row in rows:
        parts = planned[(row["strategy"], 4)]["parts_bytes"]
        assert parts["weights"] == tiny.parameters() * 4 and row["planned_mb"] * bench.MB == sum(parts.values())


def test_a_point_planned_over_the_budget_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    monkeypatch.setattr(bench, "run_point", lambda module, point, *rest: ran.append(point["strategy"]) or {
        "status": "ok"})
    monkeypatch.setattr(bench, "time_batch", lambda point, names, rounds: {name: [1.0] for name in names})
    parser = bench.get_args_parser()
    args = bench.resolve_args(parser.parse_args(["--batches", "8", "--strategies", "gradcache,full_batch",
                                                 "--memory-budget-gb", "1"]), parser)
    small, large = ({**dict.fromkeys(bench.PARTS, 0), "weights": int(gib * bench.GB)} for gib in (0.5, 1.5))
    plans = [bench.PointPlan("gradcache", 8, small, 1.0, 2.0), bench.PointPlan("full_batch", 8, large, 1.0, 2.0)]
    rows = bench.run_sweep(args, "unused", "unused", None, plans)
    assert ran == ["gradcache"]
    assert [row["status"] for row in rows] == ["ok", "skipped"] and "--memory-budget-gb 1" in rows[1]["error"]
    assert bench.budget_refusal(plans, 0.4) is not None and bench.budget_refusal(plans, 1.0) is None


@pytest.mark.parametrize("argv", [["--strategies", "gradcache,deepspeed"], ["--batches", "1"], ["--chunk", "-1"],
                                  ["--passage-words", "9,3"], ["--batches", "a,b"], ["--shape", "qwen2-7b"],
                                  ["--shape", "tiny", "--heads", "3"], ["--kv-heads", "3"], ["--vocab", "20"],
                                  ["--memory-budget-gb", "0"]])
def test_bad_options_exit_2(argv: list[str]) -> None:
    parser = bench.get_args_parser()
    with pytest.raises(SystemExit) as exit_info:
        bench.resolve_args(parser.parse_args(argv), parser)
    assert exit_info.value.code == 2


@pytest.mark.slow
def test_a_point_runs_in_a_fresh_process(tmp_path: Path) -> None:
    folder = bench.write_decoder(tmp_path / "decoder", hidden=16, layers=1, heads=2, intermediate=32, vocab=300)
    point = {"model": str(folder), "tokenizer": str(folder), "shape": None, "strategy": "gradcache", "batch": 4,
             "chunk": 2, "chunk_tokens": 24, "max_length": 20, "query_words": [2, 4], "passage_words": [3, 10],
             "lora_rank": 2, "autocast": "bf16",
             "bf16_weights": False, "threads": 1, "device": "cpu", "memory_budget_gb": 4.0}
    result = run_point(bench.__spec__.name, point, time_budget_s=300)
    assert result["status"] == "ok", result
    assert result["peak_mb"] >= 0 and torch.isfinite(torch.tensor(result["loss_value"]))
