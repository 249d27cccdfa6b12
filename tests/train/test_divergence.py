"""A run that diverges stops with "... became non-finite at step N", exit DIVERGED, and never writes a checkpoint
of non-finite weights; an fp16 run whose gradient scaler skips steps after an overflow continues and logs them."""
import csv
import json

import pytest
import torch

import gradcache
from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.checkpoints.atomic import load_checkpoint


def _log(folder) -> list[dict[str, str]]:
    with open(folder / "train_log.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def _all_finite(state: dict) -> bool:
    return all(torch.isfinite(value).all() for value in state.values() if value.is_floating_point())


def test_a_huge_learning_rate_diverges_with_the_message_and_no_non_finite_checkpoint(tmp_path, tiny_args, capsys):
    status = main(tiny_args("simclr", tmp_path, "--optimizer", "sgd", "--lr", "1e12", "--steps", "8",
                            "--checkpoint-every", "1"))
    error = capsys.readouterr().err
    assert status == errors.DIVERGED, error
    assert "became non-finite at step" in error and "Traceback" not in error
    diverged_at = int(error.split("non-finite at step ")[1].split()[0])
    assert diverged_at <= 8
    if diverged_at > 1:  # the checkpoints of the steps before are kept, and finite
        saved = load_checkpoint(tmp_path)
        assert saved["step"] == diverged_at - 1 and _all_finite(saved["model"]) and _all_finite(saved["loss"])
    else:
        assert not (tmp_path / "last.pt").exists()
    assert not (tmp_path / "metrics.json").exists()


def _on_second_call(monkeypatch, owner, name, spoil):
    """Wrap owner.name so that its second call, once done, spoils what it worked on."""
    original, calls = getattr(owner, name), []

    def wrapped(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            spoil(self)
        return result

    monkeypatch.setattr(owner, name, wrapped)


def _nan_gradient(strategy) -> None:
    encoder = strategy.shared_encoder or strategy.encoders[0]
    next(p for p in encoder.parameters() if p.grad is not None).grad.fill_(float("nan"))


@torch.no_grad()
def _infinite_weight(optimizer) -> None:
    optimizer.param_groups[0]["params"][0].fill_(float("inf"))


@pytest.mark.parametrize(("what", "owner", "name", "spoil"), [
    ("gradients", gradcache.GradCache, "step", _nan_gradient),
    ("weights", torch.optim.AdamW, "step", _infinite_weight),
])
def test_non_finite_gradients_or_weights_stop_the_run_keeping_the_last_good_checkpoint(
        tmp_path, tiny_args, capsys, monkeypatch, what, owner, name, spoil):
    _on_second_call(monkeypatch, owner, name, spoil)
    status = main(tiny_args("simclr", tmp_path, "--steps", "4", "--checkpoint-every", "1"))
    assert status == errors.DIVERGED
    assert f"the {what} became non-finite at step 2" in capsys.readouterr().err
    saved = load_checkpoint(tmp_path)
    assert saved["step"] == 1 and _all_finite(saved["model"])


class _HugeInitialScale(torch.amp.GradScaler):
    """The default scaler but for its initial scale: the first steps' fp16 gradients overflow."""

    INITIAL = 2.0**40

    def __init__(self, device: str = "cuda", enabled: bool = True) -> None:
        super().__init__(device, init_scale=self.INITIAL, enabled=enabled)


def test_fp16_steps_the_scaler_skips_are_logged_and_the_run_continues(tmp_path, tiny_args, monkeypatch):
    monkeypatch.setattr(torch.amp, "GradScaler", _HugeInitialScale)
    assert main(tiny_args("simclr", tmp_path, "--precision", "fp16", "--steps", "4")) == errors.OK
    skipped = [int(row["skipped"]) for row in _log(tmp_path)]
    assert len(skipped) == 4 and skipped[0] == 1  # 2**40 overflows fp16 at once
    assert json.loads((tmp_path / "metrics.json").read_text())["skipped_steps"] == sum(skipped)
    # the scaler halves its scale on every skipped step (and grows it only after 2,000 good ones)
    assert load_checkpoint(tmp_path)["scaler"]["scale"] == _HugeInitialScale.INITIAL * 0.5 ** sum(skipped)


def test_fp32_steps_are_never_skipped(tmp_path, tiny_args):
    assert main(tiny_args("simclr", tmp_path, "--steps", "2")) == errors.OK
    assert [row["skipped"] for row in _log(tmp_path)] == ["0", "0"]
