"""`gradcache train vlm`: its options refused by name before anything is written, its model folders told apart
from text's, LoRA on the language model alone (never the vision tower nor its merger), the frozen tower handed to
the strategy for reuse, FSDP2's units, and the held-out retrieval against a brute-force ranking; end to end
(slow): the default run at a tiny size writes its metrics and their `_random_init` twins, and a resume after a
kill continues with the same losses."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')

from gradcache.cli import main  # noqa: E402
from gradcache.train import errors  # noqa: E402
from gradcache.train.config import RunConfig  # noqa: E402
from gradcache.train.model_folders import model_folder_format  # noqa: E402
from gradcache.train.modes import MODES, folder_reader  # noqa: E402
from gradcache.train.modes.lora import lora_settings  # noqa: E402
from gradcache.train.modes.vision_language import VisionLanguage, lora_targets  # noqa: E402
from tests.vlm_models import tiny_idefics3, tiny_qwen2_vl, write_tiny_qwen2_vl  # noqa: E402

# the default run at a tiny size: the preset on the built-in shapes, a few steps
TINY_VLM = ["--train-size", "64", "--test-size", "16", "--batch-size", "8", "--chunk-size", "4", "--warmup", "1",
            "--quiet", "--workers", "0", "--threads", "1", "--eval-every", "0"]
METRICS = ("recall@1", "recall@10", "mrr@10", "ndcg@10")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory) -> Path:
    return write_tiny_qwen2_vl(tmp_path_factory.mktemp("vlm") / "qwen2_vl", padding_side="left")


def _fails(argv: list[str], capsys, *fragments: str) -> None:
    assert main(argv) == errors.UsageError.exit_status
    message = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in message, message


def test_the_mode_is_registered_under_its_name():
    assert isinstance(MODES["vlm"], VisionLanguage)


@pytest.mark.parametrize("extra, fragments", [
    (["--lora-alpha", "4"], ["--lora-alpha", "--lora-rank"]),
    (["--lora-rank", "4", "--train-vision"], ["--train-vision", "--lora-rank 4"]),
    (["--query-prompt", "  "], ["--query-prompt", "is empty"]),
    (["--model", "no-such-preset"], ["--model no-such-preset", "tiny-qwen2-vl"]),
    (["--lora-rank", "4", "--lora-targets", "q_proj,qkv"], ["--lora-targets q_proj,qkv: 'qkv'", "language model",
                                                             "k_proj, o_proj, q_proj"]),
])
def test_bad_options_exit_2_naming_them_and_write_nothing(tmp_path, capsys, extra, fragments):
    """`qkv` is a leaf of the vision tower alone: LoRA never adapts it."""
    _fails(["train", "vlm", *TINY_VLM, "--steps", "1", "--output-dir", str(tmp_path / "run"), *extra], capsys,
           *fragments)
    assert not (tmp_path / "run").exists()


def test_a_text_model_folder_is_refused_naming_the_families(tmp_path, tiny_bert, capsys):
    _fails(["train", "vlm", *TINY_VLM, "--model", str(tiny_bert), "--output-dir", str(tmp_path / "run")], capsys,
           f"--model {tiny_bert}", "'bert'", "Qwen2-VL", "Idefics3")


def test_a_vlm_folder_without_its_processor_is_refused(tmp_path, capsys):
    model, _ = tiny_qwen2_vl()
    model.save_pretrained(tmp_path / "bare")
    _fails(["train", "vlm", *TINY_VLM, "--model", str(tmp_path / "bare"), "--output-dir", str(tmp_path / "run")],
           capsys, "holds no processor", "save_pretrained")


def test_a_vlm_folder_is_read_by_the_vlm_mode_and_a_text_folder_by_text(qwen_folder, tiny_bert):
    assert folder_reader(model_folder_format(qwen_folder), qwen_folder) is MODES["vlm"]
    assert folder_reader(model_folder_format(tiny_bert), tiny_bert) is MODES["text"]


def _encoder(build, **options):
    from gradcache.models import VisionLanguageEncoder

    model, _ = build()
    return VisionLanguageEncoder(model, **options)


@pytest.mark.parametrize("build, language, leaves", [
    (tiny_qwen2_vl, "language_model", {"q_proj", "v_proj"}),  # qwen2_vl_text: peft's default for qwen2
    (tiny_idefics3, "text_model", {"q_proj", "v_proj"}),  # llama: peft's default
])
def test_lora_adapts_the_language_model_alone(build, language, leaves):
    """peft's default leaves for the language model's type, every one of them inside the language model; with
    LoRA built, only adapter weights learn and none sits in the vision tower or its connector."""
    mode = MODES["vlm"]
    config = RunConfig(mode="vlm", lora_rank=2)
    encoder = _encoder(build)
    names = lora_targets(encoder, lora_settings(config))
    assert names and all(f"{language}." in name for name in names)
    assert {name.rsplit(".", 1)[-1] for name in names} == leaves
    expected = {name for name, module in encoder.model.named_modules() if isinstance(module, torch.nn.Linear)
                and f"{language}." in name and name.rsplit(".", 1)[-1] in leaves}
    assert set(names) == expected
    from gradcache.train.modes.lora import wrap_lora

    encoder.model = wrap_lora(encoder.model, lora_settings(config), names)
    trained = [name for name, p in encoder.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in name and f"{language}." in name for name in trained)
    assert not any(p.requires_grad for p in encoder.vision_tower.parameters())
    assert mode.reused_modules(config, encoder) == [encoder.vision_tower]


def test_every_linear_layer_of_the_language_model_when_peft_has_no_default(monkeypatch):
    import gradcache.train.modes.vision_language as vision_language

    monkeypatch.setattr(vision_language, "peft_default_targets", lambda model_type: None)
    encoder = _encoder(tiny_qwen2_vl)
    names = lora_targets(encoder, lora_settings(RunConfig(mode="vlm", lora_rank=2)))
    linears = {name for name, module in encoder.model.named_modules() if isinstance(module, torch.nn.Linear)}
    assert set(names) == {name for name in linears if name.startswith("language_model.")}
    assert any(name.startswith("visual.") for name in linears)  # there were others to leave out


def test_train_vision_leaves_the_tower_trainable_and_reuses_nothing():
    config = RunConfig(mode="vlm", train_vision=True)
    encoder = _encoder(tiny_qwen2_vl, train_vision=True)
    assert all(p.requires_grad for p in encoder.vision_tower.parameters())
    assert MODES["vlm"].reused_modules(config, encoder) == []
    assert MODES["text"].reused_modules(config, encoder) == []  # the other modes reuse nothing


def test_fsdp_shards_each_decoder_layer_and_each_vision_block():
    from gradcache.train.parallel.fsdp import _outermost_blocks, is_block

    encoder = _encoder(tiny_qwen2_vl)
    units = {id(module) for module in _outermost_blocks(encoder, is_block)}
    assert all(id(layer) in units for layer in encoder.language_model.layers)
    assert all(id(block) in units for block in encoder.vision_tower.blocks)


def _run_metrics(folder: Path) -> dict:
    return json.loads((folder / "metrics.json").read_text())


def _losses(folder: Path) -> list[str]:
    with open(folder / "train_log.csv", newline="") as handle:
        return [row["loss"] for row in csv.DictReader(handle)]


@pytest.mark.slow
def test_the_default_run_at_a_tiny_size_writes_both_directions_and_their_random_init_twins(tmp_path):
    assert main(["train", "vlm", *TINY_VLM, "--steps", "2", "--output-dir", str(tmp_path)]) == 0
    written = _run_metrics(tmp_path)
    for direction in ("query_to_positive", "positive_to_query"):
        for metric in METRICS:
            key = f"{direction}_{metric}"
            assert 0.0 <= written[key] <= 100.0 and 0.0 <= written[f"{key}_random_init"] <= 100.0, key
    assert (tmp_path / "model" / "modules.json").is_file()


@pytest.mark.slow
def test_gradcache_with_the_tower_reused_trains_the_adapter_of_the_full_batch(tmp_path, qwen_folder, monkeypatch):
    """LoRA dropout off (the strategies draw other masks), --grad-checkpointing and --chunk-tokens over rows of
    text and images: GradCache, handed the frozen tower to reuse, ends 3 steps with the full batch's adapter."""
    import gradcache.train.run as run_module
    from gradcache.train.checkpoints.atomic import load_checkpoint
    from tests.train.vlm_rows import write_png_rows

    handed, build = [], run_module.build_strategy

    def recording(*args, **kwargs):
        handed.append(args[-1] if len(args) > 7 else kwargs.get("reuse_outputs"))
        return build(*args, **kwargs)

    monkeypatch.setattr(run_module, "build_strategy", recording)
    rows = write_png_rows(tmp_path / "rows", 24)
    options = ["--model", str(qwen_folder), "--data", str(rows), "--lora-rank", "2", "--lora-dropout", "0",
               "--lora-targets", "q_proj,k_proj,v_proj,o_proj", "--test-size", "8", "--batch-size", "8",
               "--chunk-size", "4", "--steps", "3", "--warmup", "1", "--lr", "1e-2", "--workers", "0", "--threads",
               "1", "--quiet", "--eval-every", "0"]
    assert main(["train", "vlm", *options, "--grad-checkpointing", "--chunk-tokens", "60",
                 "--output-dir", str(tmp_path / "cached")]) == 0
    assert main(["train", "vlm", *options, "--strategy", "full", "--output-dir", str(tmp_path / "full")]) == 0
    (tower,) = handed[0]
    assert type(tower).__name__.startswith("Qwen2VisionTransformer")
    cached, full = (load_checkpoint(tmp_path / name)["model"] for name in ("cached", "full"))
    assert cached.keys() == full.keys() and any(".o_proj.lora_A" in name for name in cached)
    for name in cached:
        torch.testing.assert_close(cached[name], full[name], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_a_resume_after_a_kill_continues_with_the_same_losses(tmp_path, killed_after_step, qwen_folder, lora):
    """4 steps at once, and 4 steps killed after step 3 (the checkpoint of step 2) then resumed: the same losses
    and the same trained weights, the frozen tower rebuilt (the preset's, from its seed; with `--lora-rank` on the
    tiny Qwen2-VL folder and its rows of images, the base from the folder: the checkpoint holds the adapter alone)."""
    from gradcache.train.checkpoints.atomic import load_checkpoint
    from tests.train.vlm_rows import write_png_rows

    argv = ["train", "vlm", *TINY_VLM, "--steps", "4", "--checkpoint-every", "2"]
    if lora:
        argv += ["--model", str(qwen_folder), "--data", str(write_png_rows(tmp_path / "rows", 24)),
                 "--test-size", "8", "--lora-rank", "4"]  # LoRA dropout on: replayed exactly
    assert main([*argv, "--output-dir", str(tmp_path / "whole")]) == 0
    killed_after_step(3, [*argv, "--output-dir", str(tmp_path / "cut")])
    assert load_checkpoint(tmp_path / "cut")["step"] == 2
    assert main(["train", "vlm", "--resume", str(tmp_path / "cut"), "--quiet", "--threads", "1"]) == 0
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "whole")
    whole, resumed = (load_checkpoint(tmp_path / name)["model"] for name in ("whole", "cut"))
    assert whole.keys() == resumed.keys() and not any(".visual." in key for key in whole)
    assert all("lora_" in key for key in whole) == lora
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name
    suffix = "_initial" if lora else "_random_init"  # a folder's step 0 is the pretrained model
    assert f"query_to_positive_recall@1{suffix}" in _run_metrics(tmp_path / "cut")



@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_to_the_same_losses_and_weights(tmp_path):
    """The same run at once and in a process of its own killed with SIGKILL (no handler runs) right after its first
    checkpoint, then `--resume`d: the same losses, step for step, and the same weights."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from gradcache.train.checkpoints.atomic import load_checkpoint

    argv = ["train", "vlm", *TINY_VLM, "--steps", "40", "--checkpoint-every", "3"]
    assert main([*argv, "--output-dir", str(tmp_path / "whole")]) == 0
    cut = tmp_path / "cut"
    run = subprocess.Popen([sys.executable, "-m", "gradcache", *argv, "--output-dir", str(cut)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 240
    try:
        while not (cut / "last.pt").exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(run.pid, signal.SIGKILL)
        _, err = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == -signal.SIGKILL, err  # killed mid-run, not finished before the kill
    step = load_checkpoint(cut)["step"]
    assert 3 <= step < 40
    assert main(["train", "vlm", "--resume", str(cut), "--quiet", "--threads", "1"]) == 0
    assert _losses(cut) == _losses(tmp_path / "whole")
    whole, resumed = (load_checkpoint(tmp_path / name)["model"] for name in ("whole", "cut"))
    assert whole.keys() == resumed.keys()
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name

def _brute_force(asked: np.ndarray, candidates: np.ndarray, relevant: np.ndarray) -> dict[str, float]:
    """recall@1, recall@10, mrr@10, ndcg@10 (%) by a loop over the rows: the 1-based rank of each row's relevant
    candidate among all candidates by inner product."""
    sums = dict.fromkeys(METRICS, 0.0)
    for vector, want in zip(asked, relevant):
        scores = candidates @ vector
        rank = 1 + int((scores > scores[want]).sum())
        sums["recall@1"] += rank == 1
        sums["recall@10"] += rank <= 10
        sums["mrr@10"] += 1.0 / rank if rank <= 10 else 0.0
        sums["ndcg@10"] += 1.0 / np.log2(rank + 1.0) if rank <= 10 else 0.0
    return {key: 100.0 * value / len(asked) for key, value in sums.items()}


def test_held_out_retrieval_ranks_both_ways_as_a_brute_force_loop():
    """40 rows over 30 distinct positives (some rows share one: one candidate) and 40 distinct queries, each text
    embedded by its side (the query and passage prompts differ): both directions against a loop."""
    from gradcache.train.data.vision_language import RowSide, VisionLanguageRow
    from gradcache.train.eval.vision_language_retrieval import evaluate_vision_language_retrieval

    generator = np.random.default_rng(0)
    vectors: dict[tuple[str, str], np.ndarray] = {}

    def embed(inputs, tower):
        rows = []
        for item in inputs:
            key = (tower, item.text)
            if key not in vectors:
                vector = generator.normal(size=8)
                vectors[key] = vector / np.linalg.norm(vector)
            rows.append(vectors[key])
        return torch.tensor(np.stack(rows), dtype=torch.float32)

    rows = [VisionLanguageRow(RowSide(f"query {k}"), RowSide(f"passage {k % 30}")) for k in range(40)]
    got = evaluate_vision_language_retrieval(embed, rows, None)
    queries = np.stack([vectors[("query", f"query {k}")] for k in range(40)])
    passages = np.stack([vectors[("passage", f"passage {k}")] for k in range(30)])
    by_positive = np.array([k % 30 for k in range(40)])
    want = {f"query_to_positive_{key}": value
            for key, value in _brute_force(queries, passages, by_positive).items()}
    want.update({f"positive_to_query_{key}": value
                 for key, value in _brute_force(passages[by_positive], queries, np.arange(40)).items()})
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], abs=1e-4), key
    assert 0 < want["query_to_positive_mrr@10"] < 100


def _idefics3_folder(folder: Path) -> Path:
    model, processor = tiny_idefics3(padding_side="left")
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2_vl", "idefics3"])
def test_a_lora_run_on_a_vlm_folder_exports_what_sentence_transformers_encodes_as_gradcache_encode(tmp_path, family):
    """A tiny VLM folder and rows of text and PNG images (text only, image only, both): `--lora-rank 4` trains;
    RUN/model loads in SentenceTransformer, and a text, an image and an image + text pair embed as `gradcache encode
    RUN --key text --image-key image` embeds them (cosine 0.9999); RUN/model trains again as a --model."""
    from PIL import Image
    from sentence_transformers import SentenceTransformer

    from tests.train.vlm_rows import write_png_rows

    folder = (write_tiny_qwen2_vl(tmp_path / family, padding_side="left") if family == "qwen2_vl"
              else _idefics3_folder(tmp_path / family))
    rows = write_png_rows(tmp_path / "rows", 24)
    run = tmp_path / "run"
    assert main(["train", "vlm", "--model", str(folder), "--data", str(rows), "--lora-rank", "4", "--test-size", "8",
                 "--batch-size", "8", "--chunk-size", "4", "--steps", "2", "--warmup", "1", "--lr", "1e-2",
                 "--workers", "0", "--threads", "1", "--quiet", "--output-dir", str(run)]) == 0
    assert (run / "model" / "adapter" / "adapter_config.json").is_file()
    inputs = [{"text": "a cat sits on the mat"}, {"image": "images/0.png"},
              {"text": "the red dog", "image": "images/1.png"}]
    table = tmp_path / "rows" / "inputs.jsonl"
    table.write_text("".join(json.dumps(row) + "\n" for row in inputs))
    assert main(["encode", str(run), "--data", str(table), "--key", "text", "--image-key", "image",
                 "--tower", "passage", "--output", str(tmp_path / "ours.npy")]) == 0
    ours = np.load(tmp_path / "ours.npy")
    pictures = [Image.open(tmp_path / "rows" / "images" / f"{k}.png").convert("RGB") for k in (0, 1)]
    model = SentenceTransformer(str(run / "model"), device="cpu")
    theirs = model.encode([inputs[0]["text"], pictures[0], {"text": inputs[2]["text"], "image": pictures[1]}],
                          convert_to_numpy=True, normalize_embeddings=True)
    cosine = (ours * theirs).sum(axis=1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cosine.min() >= 0.9999, cosine
    # the SentenceTransformer folder is a --model too: its Transformer module's model and processor
    again = tmp_path / "again"
    assert main(["train", "vlm", "--model", str(run / "model"), "--data", str(rows), "--test-size", "8",
                 "--batch-size", "8", "--chunk-size", "4", "--steps", "1", "--workers", "0", "--threads", "1",
                 "--quiet", "--output-dir", str(again)]) == 0
    assert json.loads((again / "metrics.json").read_text())["steps"] == 1
