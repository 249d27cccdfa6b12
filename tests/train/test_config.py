"""RunConfig: what a checkpoint stores, read back by version; what a version-1 checkpoint lacked is filled in
with the values its run trained under, and such a checkpoint still resumes."""
import dataclasses

import pytest
import torch

from gradcache.cli import main
from gradcache.train.checkpoints.atomic import load_checkpoint, save_checkpoint
from gradcache.train.config import CONFIG_VERSION, RunConfig
from gradcache.train.errors import CheckpointError
from gradcache.train.modes import MODES

V1_ADDED_LATER = ("rotation", "fsdp", "fsdp_reduce", "cpu_offload")
CLIP_ONLY = ("csv_image_key", "csv_caption_key", "csv_separator", "context_length", "text_width", "text_layers",
             "text_heads", "max_logit_scale")


def _version_1(config: RunConfig, absent: tuple[str, ...]) -> dict:
    """The argparse namespace a version-1 checkpoint stored: no version, argparse's own entry, fields absent."""
    stored = {k: v for k, v in dataclasses.asdict(config).items() if k not in absent}
    return {**stored, "subcommand": "train"}


def test_round_trip():
    config = RunConfig(mode="clip", batch_size=64, steps=3, tile_size=16, fsdp=True)
    stored = config.to_dict()
    assert stored["config_version"] == CONFIG_VERSION
    assert RunConfig.from_dict(stored) == config


def test_version_1_gets_the_values_its_run_trained_under():
    simclr = RunConfig(mode="simclr", width=8, crop_min_scale=0.3, text_width=999, max_logit_scale=7.0)
    read = RunConfig.from_dict(_version_1(simclr, V1_ADDED_LATER + CLIP_ONLY))
    assert read.width == 8 and read.crop_min_scale == 0.3
    assert (read.rotation, read.fsdp, read.fsdp_reduce, read.cpu_offload) == (0.0, False, "chunk", False)
    assert (read.text_width, read.max_logit_scale) == (128, 100.0)  # the clip options it never had
    clip = RunConfig(mode="clip", hidden_dim=7)
    assert RunConfig.from_dict(_version_1(clip, ("hidden_dim", "crop_min_scale"))).hidden_dim == 512


def test_a_newer_or_an_incomplete_checkpoint_is_refused():
    with pytest.raises(CheckpointError, match="newer gradcache"):
        RunConfig.from_dict({**RunConfig().to_dict(), "config_version": CONFIG_VERSION + 1})
    stored = RunConfig().to_dict()
    del stored["lr"]
    with pytest.raises(CheckpointError, match=r"lack \['lr'\]"):
        RunConfig.from_dict(stored)


def test_every_mode_default_is_a_config_field():
    names = {f.name for f in dataclasses.fields(RunConfig)}
    for mode in MODES.values():
        assert set(mode.defaults) <= names, mode.name


@pytest.mark.slow
def test_a_version_1_checkpoint_resumes(tmp_path, tiny_args, killed_after_step):
    """A run cut after step 3 (checkpoint at step 2), its checkpoint rewritten as version 1 wrote it, resumes
    into the weights of the uninterrupted run."""
    args = ["--steps", "4", "--checkpoint-every", "2"]
    assert main(tiny_args("simclr", tmp_path / "whole", *args)) == 0
    killed_after_step(3, tiny_args("simclr", tmp_path / "cut", *args))
    state = load_checkpoint(tmp_path / "cut")
    state["args"] = _version_1(RunConfig.from_dict(state["args"]), V1_ADDED_LATER + CLIP_ONLY)
    del state["initial"]  # version 1 kept no step-0 metrics beside the baselines
    save_checkpoint(state, tmp_path / "cut" / "last.pt")
    assert main(["train", "simclr", "--resume", str(tmp_path / "cut"), "--quiet", "--workers", "0"]) == 0
    resumed, whole = load_checkpoint(tmp_path / "cut"), load_checkpoint(tmp_path / "whole")
    assert resumed["step"] == 4 and resumed["args"]["config_version"] == CONFIG_VERSION
    for name in whole["model"]:
        assert torch.equal(resumed["model"][name], whole["model"][name]), name


# What each version's checkpoints lacked, and the values their runs trained under: written out here, apart from
# the field metadata that RunConfig.from_dict reads, so a wrong `added` or `before` there fails this test.
ADDED_IN = {
    3: dict(pooling=None, max_length=128, separate_towers=False, query_key="query", positive_key="positive",
            negative_keys=None, negatives_per_query=None, symmetric=False, pretrained=None),
    4: dict(queue_size=0, queue_warmup=0),
    5: dict(collective_timeout=1800.0),
    6: dict(max_bad_share=1.0),
    7: dict(memory_budget=None, chunk_tokens=None),
    8: dict(report_to=None, matryoshka_dims=None, guide=None, guide_margin=0.0,
            guide_margin_strategy="absolute"),
    9: dict(eval_data=None, eval_reference_size=None, shuffle_buffer=1000, train_num_samples=None, corpus=None),
    10: dict(progress_every=30.0),
    11: dict(lora_rank=None, lora_alpha=None, lora_dropout=None, lora_targets=None),
    12: dict(query_prompt=None, passage_prompt=None, exclude_prompt_from_pooling=False),
    13: dict(deepspeed=None),
    14: dict(kind="dense", document_regularizer_weight=3e-5, query_regularizer_weight=5e-5, token_dim=128,
            in_batch_negatives=4),
    15: dict(query_expansion=None, attend_to_expansion=False),
    16: dict(compile=False, compile_backend="inductor"),
    17: dict(deepspeed_settings=None, base_fingerprint=None),
    18: dict(fingerprint="weights"),
}


@pytest.mark.parametrize("version", range(2, 18))
def test_each_older_version_gets_the_values_its_run_trained_under(version):
    lacking = {name: value for added, names in ADDED_IN.items() if added > version for name, value in names.items()}
    changed = RunConfig(mode="text", max_length=64, queue_size=5, collective_timeout=9.0, max_bad_share=0.5,
                        memory_budget=100, pooling="cls", report_to=["tensorboard"])
    stored = {k: v for k, v in changed.to_dict().items() if k not in lacking}
    read = RunConfig.from_dict({**stored, "config_version": version})
    for name, value in lacking.items():
        assert getattr(read, name) == value, (version, name)
    for name in stored.keys() - {"config_version"}:
        assert getattr(read, name) == getattr(changed, name), (version, name)


def test_the_fields_that_fix_the_parameters_shapes():
    from gradcache.train.config import MODEL_FIELDS

    assert set(MODEL_FIELDS) == {"mode", "model", "width", "norm", "image_size", "hidden_dim", "projection_dim",
                                 "context_length", "text_width", "text_layers", "text_heads", "separate_towers",
                                 "lora_rank", "lora_targets", "kind", "token_dim", "train_vision"}


def test_the_fields_a_resume_may_give_anew():
    from gradcache.train.config import KEPT_UNLESS_GIVEN, RUN_LOCAL

    assert set(RUN_LOCAL) == {"device", "output_dir", "quiet", "workers", "threads", "resume", "checkpoint_every",
                              "eval_every", "cpu_offload", "collective_timeout", "report_to",
                              "progress_every", "compile", "compile_backend"}
    assert set(KEPT_UNLESS_GIVEN) == {"report_to", "workers"}


def test_every_default_lies_in_its_range():
    """The ranges of the metadata are what preflight checks: a default outside its own range would refuse every
    run that does not give the option."""
    from gradcache.train.preflight import _check_range

    config = RunConfig()
    bounded = [f for f in dataclasses.fields(RunConfig)
               if any(f.metadata.get(key) is not None for key in ("at_least", "above", "at_most", "below"))]
    assert {"batch_size", "momentum", "max_bad_share", "lr", "max_length", "crop_min_scale"} <= {f.name for f in bounded}
    for field in bounded:
        _check_range(field, getattr(config, field.name))
        for mode in MODES.values():
            _check_range(field, mode.defaults.get(field.name, getattr(config, field.name)))
