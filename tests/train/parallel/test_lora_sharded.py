"""`gradcache train text --lora-rank R` on a tiny decoder (last-token pooling, a query prompt) under `--fsdp` and
`--deepspeed` ZeRO-1, 2 and 3, and under DDP, on two forked gloo ranks: each logs the losses of the same run on one
process (computed here, without sharding) and ends with its adapter; the DDP, FSDP and ZeRO-3 runs are killed after
step 3 and resumed from the checkpoint of step 2, so their losses also show the resume exact; the checkpoints hold the adapter and its
optimizer state alone; RUN/model/adapter loads in PEFT, and `gradcache export` reads the adapter back from
the checkpoints. `--precision bf16` under ZeRO-2 against one process in bf16. Two LoRA towers under DeepSpeed exit 2.
LoRA dropout is off: the ranks would draw other masks than one process does."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
from pathlib import Path

import pytest
import torch

from gradcache.cli import main
from gradcache.train import errors
from tests.tiny_decoder_model import write_tiny_decoder
from tests.train.conftest import text_args

peft = pytest.importorskip("peft", reason='the dev extra installs it: pip install -e ".[dev]"')
LORA = ["--pooling", "last", "--query-prompt", "query: ", "--lora-rank", "4", "--lora-dropout", "0",
        "--steps", "3", "--checkpoint-every", "2", "--eval-every", "0"]
STAGES = (1, 2, 3)
CUT = ("ddp", "fsdp", "zero3")  # killed after step 3 (the checkpoint holds step 2), then resumed
PLACEMENTS = ["ddp", "fsdp", *(f"zero{s}" for s in STAGES)]
BF16 = ["--precision", "bf16"]
BF16_TOLERANCE = 2e-2  # as the library's bf16 tests (tests/test_autocast.py, tests/integrations/)


def _losses(folder: Path) -> list[float]:
    with open(folder / "train_log.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["step"]) for row in rows] == [1, 2, 3]
    return [float(row["loss"]) for row in rows]


def _adapter(model_folder: Path) -> dict[str, torch.Tensor]:
    """`model_folder`/adapter as PEFT loads it onto its base model (the test's decoder, `llama` beside the runs),
    the adapter's weights by their PEFT names."""
    import transformers

    base = transformers.AutoModel.from_pretrained(str(model_folder.parent.parent / "llama"))
    model = peft.PeftModel.from_pretrained(base, str(model_folder / "adapter"))
    state = peft.get_peft_model_state_dict(model)
    assert state and all("lora_" in name for name in state)
    return state


def _checkpoint(run: Path, which: str = "last"):
    from gradcache.train.checkpoints.run_checkpoint import kind_of

    (path,) = [p for p in run.iterdir() if p.name in (f"{which}.dcp", f"{which}.ds", f"{which}.pt")]
    return kind_of(path)(path)


def ranks_worker(rank: int, world_size: int, root: str) -> dict:
    """On every rank: the FSDP run (killed, resumed), one run per ZeRO stage (ZeRO-3's killed, resumed), ZeRO-2 in
    bf16."""
    from gradcache.train.run_folder.log import RunLog

    os.environ["LOCAL_RANK"] = str(rank)  # torchrun sets it; DeepSpeed reads it
    root = Path(root)
    runs = {"ddp": [], "fsdp": ["--fsdp"],
            **{f"zero{s}": ["--deepspeed", str(root / f"zero{s}.json")] for s in STAGES},
            "zero2_bf16": ["--deepspeed", str(root / "zero2.json"), *BF16]}
    original, status = RunLog.log_step, {}

    def killed_after_step_3(self, row):
        original(self, row)
        if row["step"] == 3:
            raise KeyboardInterrupt  # on every rank, as a kill of the job would

    for name, options in runs.items():
        argv = text_args(root / "llama", root / name, *LORA, *options, "--threads", "1")
        with contextlib.redirect_stderr(io.StringIO()) as stderr:
            if name not in CUT:
                status[name] = main(argv)
            else:
                RunLog.log_step = killed_after_step_3
                try:
                    status[f"{name}_cut"] = main(argv)
                finally:
                    RunLog.log_step = original
                status[name] = main(["train", "text", "--resume", str(root / name), "--quiet", "--threads", "1"])
        status[f"{name}_stderr"] = stderr.getvalue()
    return status


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The two-rank runs, then the references: the same runs on one process without sharding, fp32 and bf16."""
    pytest.importorskip("deepspeed", reason='pip install -e ".[deepspeed]"')
    from tests.multiprocess import run_on_ranks

    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # gloo on CPU, also where a GPU is present
    import deepspeed  # noqa: F401  imported once here, inherited by the forked ranks

    root = tmp_path_factory.mktemp("lora_sharded")
    write_tiny_decoder(root / "llama", "llama", padding_side="left")
    for stage in STAGES:  # ZeRO-3 partitions every parameter: by default the tiny model's would all stay whole
        partitioned = {"stage3_param_persistence_threshold": 0} if stage == 3 else {}
        (root / f"zero{stage}.json").write_text(json.dumps({"zero_optimization": {"stage": stage, **partitioned}}))
    status = run_on_ranks(ranks_worker, 2, str(root))
    with contextlib.redirect_stderr(io.StringIO()) as stderr:
        assert main(text_args(root / "llama", root / "one", *LORA)) == 0
    status[0]["one_stderr"] = stderr.getvalue()
    assert main(text_args(root / "llama", root / "one_bf16", *LORA, *BF16)) == 0
    return root, status


@pytest.mark.slow
@pytest.mark.parametrize("name", PLACEMENTS)
def test_two_ranks_train_the_adapter_of_one_process(runs, name):
    root, status = runs
    expected = {name: 0, f"{name}_cut": errors.INTERRUPTED} if name in CUT else {name: 0}
    assert [{key: s[key] for key in expected} for s in status] == [expected] * 2
    if name in CUT:  # resumed from the checkpoint of step 2, which the final save kept as the previous one
        assert _checkpoint(root / name, "previous").meta()["step"] == 2
    assert _losses(root / name) == pytest.approx(_losses(root / "one"), rel=1e-5)
    # the first save says what it holds as one process does (ZeRO-3: counted before its parameters are partitioned)
    said = re.compile(r"holds the model's ([\d,]+) trained parameters .* its ([\d,]+) frozen parameters")
    (counts,) = said.findall(status[0]["one_stderr"])
    assert said.findall(status[0][f"{name}_stderr"])[:1] == [counts]
    ours, reference = _adapter(root / name / "model"), _adapter(root / "one" / "model")
    assert ours.keys() == reference.keys()
    for key, value in reference.items():
        torch.testing.assert_close(ours[key], value, rtol=1e-5, atol=1e-7, msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("name", PLACEMENTS)
def test_the_merged_model_is_the_one_process_merged_model(runs, name):
    """RUN/model: the base merged with the adapter (gathered from the shards under --fsdp and ZeRO-3)."""
    from safetensors.torch import load_file

    root, _ = runs
    ours, reference = (load_file(root / d / "model" / "model.safetensors") for d in (name, "one"))
    assert ours.keys() == reference.keys()
    for key, value in reference.items():
        torch.testing.assert_close(ours[key], value, rtol=1e-5, atol=1e-7, msg=key)


@pytest.mark.slow
def test_the_sharded_checkpoint_holds_the_adapter_and_its_optimizer_state_alone(runs):
    import torch.distributed.checkpoint as dcp

    root, _ = runs
    keys = dcp.FileSystemReader(str(root / "fsdp" / "last.dcp")).read_metadata().state_dict_metadata
    weights = [k for k in keys if k.startswith("model.")]
    moments = [k for k in keys if k.startswith("optimizer.state.")]
    assert weights and all("lora_" in k for k in weights)
    assert moments and all("lora_" in k for k in moments)
    # "optimizer.state.<name>.exp_avg" for every "model.<name>": each adapter weight has its moments
    assert {k.removeprefix("optimizer.state.").rsplit(".", 1)[0] for k in moments} == \
        {k.removeprefix("model.") for k in weights}


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_the_deepspeed_checkpoint_holds_the_adapter_and_its_optimizer_state_alone(runs, stage):
    """The module's saved weights (one file, or one per rank under ZeRO-3), the parameters of the optimizer's
    partitions, and the float32 weights zero_to_fp32 reads from them: the adapter's, no frozen one."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    root, _ = runs
    folder = root / f"zero{stage}" / "last.ds"
    files = sorted((folder / "state").glob("*model_states.pt"))
    assert len(files) == (2 if stage == 3 else 1)
    for file in files:
        saved = torch.load(file, weights_only=False)  # DeepSpeed's own pickle, written by this test's run
        adapter = set(saved["module"])
        assert adapter and all("lora_" in key for key in adapter)
        assert [set(group) for group in saved["param_shapes"]] == [adapter]  # what the optimizer steps
        assert not saved["frozen_param_shapes"]
    assert set(get_fp32_state_dict_from_zero_checkpoint(str(folder), tag="state")) == adapter


@pytest.mark.slow
def test_bf16_under_zero_2_trains_as_one_process_in_bf16(runs):
    root, status = runs
    assert [s["zero2_bf16"] for s in status] == [0, 0]
    assert _losses(root / "zero2_bf16") == pytest.approx(_losses(root / "one_bf16"), rel=BF16_TOLERANCE)
    # fp32 weights under bf16 autocast: the adapter is the bf16 run's, not the fp32 run's
    ours, bf16, fp32 = (_adapter(root / d / "model") for d in ("zero2_bf16", "one_bf16", "one"))

    def assert_close(got):
        for key, value in bf16.items():
            torch.testing.assert_close(got[key], value, rtol=BF16_TOLERANCE, atol=1e-6, msg=key)

    assert_close(ours)
    with pytest.raises(AssertionError):  # the tolerance tells bf16 from fp32: lora_B is the update alone
        assert_close(fp32)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fsdp", "zero3"])
def test_export_reads_the_adapter_from_the_checkpoint(runs, name):
    """`gradcache export` in one process, without sharding: the adapter of `last.dcp` (its shards) and of
    `last.ds` (zero_to_fp32 over ZeRO-3's partitions) on the base read again from --model."""
    root, _ = runs
    again = root / "exports" / name
    assert main(["export", str(root / name), "--output", str(again)]) == 0
    again, written = _adapter(again), _adapter(root / name / "model")
    assert again.keys() == written.keys()
    for key, value in written.items():
        torch.testing.assert_close(again[key], value, rtol=0, atol=0, msg=key)


def test_two_adapted_towers_under_deepspeed_exit_2(tmp_path, tiny_bert, capsys):
    """--separate-towers gives each tower its own adapter, and a DeepSpeed engine wraps one encoder."""
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    argv = text_args(tiny_bert, tmp_path / "run", "--lora-rank", "4", "--separate-towers", "--deepspeed",
                     str(tmp_path / "ds.json"))
    assert main(argv) == 2
    assert "--deepspeed cannot run with --separate-towers" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
