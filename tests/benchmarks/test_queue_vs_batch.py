"""Smoke test of benchmarks/queue_vs_batch.py: the plan matches the negatives it promises, and one tiny run
through the training program reports them back, with its quality and its own peak memory."""
from gradcache import negatives_per_anchor
from benchmarks import queue_vs_batch as bench


def test_the_queue_brings_the_small_batch_and_accumulation_to_the_large_batch_negatives():
    args = bench.get_args_parser().parse_args([])
    for mode, kind in bench.LOSS_KIND.items():
        configs = {c["config"]: c for c in bench.plan(args, mode)}
        counted = {name: negatives_per_anchor(c["strategy"], kind, c["batch"], args.chunk, queue_size=c["queue_size"])
                   for name, c in configs.items()}
        assert counted["gradcache_large"] == counted["gradcache_queue"] == counted["naive_queue"] > counted["naive"]
        # the same examples seen: steps x batch is one count for all four
        assert len({c["steps"] * c["batch"] for c in configs.values()}) == 1


def test_one_run_reports_quality_negatives_and_memory(tmp_path):
    point = dict(mode="simclr", config="gradcache_queue", strategy="gradcache", batch=8, queue_size=20, steps=3,
                 seed=0, chunk=4, image_size=16, train_size=32, test_size=16, lr=5e-3, base_batch=16, threads=1,
                 device="cpu", folder=str(tmp_path / "run"))
    result = bench.run_one(point)
    assert result["status"] == "ok"
    assert result["negatives_per_anchor"] == negatives_per_anchor("gradcache", "ntxent", 8, 4, queue_size=20)
    assert 0 <= result["quality"] <= 100 and result["peak_memory_mb"] >= 0
