"""Every numeric option of `gradcache train <mode>` refuses NaN, infinity and out-of-range values up front: exit
status 2, one line naming the option, nothing written. The options come from the parser itself, so a new one is
covered without editing this file."""
import argparse

import pytest

from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.train_options import add_train_options
from gradcache.train.modes import MODES


def _numeric_options() -> list[tuple[str, str]]:
    found = []
    for mode in MODES.values():
        parser = argparse.ArgumentParser(add_help=False)
        add_train_options(parser, mode)
        # int, float, and the options with a parser of their own (--memory-budget's sizes): every typed option
        found += [(mode.name, action.option_strings[0]) for action in parser._actions
                  if action.type is not None and action.type is not str]
    return found


NUMERIC = _numeric_options()


def test_the_parser_has_the_numeric_options_this_file_expects():
    assert {"--lr", "--temperature", "--momentum", "--weight-decay", "--image-size", "--max-bad-share",
            "--batch-size"} <= {option for _, option in NUMERIC}
    assert ("clip", "--max-logit-scale") in NUMERIC and ("text", "--max-length") in NUMERIC
    assert ("text", "--memory-budget") in NUMERIC


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", ""])  # 1e400 overflows to inf; "" is no number
@pytest.mark.parametrize(("mode", "option"), NUMERIC, ids=[f"{m}{o}" for m, o in NUMERIC])
def test_nan_infinity_and_empty_values_exit_2_and_write_nothing(tmp_path, capsys, mode, option, value):
    output = tmp_path / "run"
    assert main(["train", mode, option, value, "--output-dir", str(output)]) == errors.USAGE
    error = capsys.readouterr().err
    assert option in error and "Traceback" not in error
    assert not output.exists()


@pytest.mark.parametrize(("mode", "option", "value"), [
    ("simclr", "--lr", "0"), ("simclr", "--lr", "-1"), ("simclr", "--temperature", "0"),
    ("simclr", "--knn-temperature", "-1"), ("simclr", "--weight-decay", "-0.1"), ("simclr", "--momentum", "1"),
    ("simclr", "--momentum", "-0.5"), ("simclr", "--image-size", "1"), ("simclr", "--image-size", "7"),
    ("simclr", "--max-bad-share", "1.5"), ("simclr", "--max-bad-share", "-0.1"), ("simclr", "--hidden-dim", "0"),
    ("simclr", "--warmup", "-1"), ("simclr", "--eval-every", "-2"), ("simclr", "--workers", "-1"),
    ("clip", "--max-logit-scale", "0"), ("clip", "--text-heads", "0"), ("clip", "--context-length", "0"),
])
def test_out_of_range_values_exit_2_naming_the_option_and_write_nothing(tmp_path, capsys, mode, option, value):
    output = tmp_path / "run"
    assert main(["train", mode, option, value, "--output-dir", str(output)]) == errors.USAGE
    error = capsys.readouterr().err
    assert f"{option} " in error and value in error and "Traceback" not in error
    assert not output.exists()


def test_the_smallest_image_size_of_the_convnet_trains(tmp_path, tiny_args):
    """8 is the refused 7's neighbour: the limit is the model's, not a guess."""
    assert main(tiny_args("simclr", tmp_path, "--image-size", "8", "--steps", "1")) == errors.OK


@pytest.mark.parametrize(("mode", "flags", "cause"), [
    ("clip", ["--text-width", "16", "--text-heads", "3"], "not divisible"),  # the text tower's heads
    ("clip", ["--context-length", "1"], "at least 3"),  # a start token, one byte, an end token
    ("simclr", ["--width", "1"], "--norm group"),  # GroupNorm's 8 groups
    ("clip", ["--width", "1"], "--norm group"),
    ("simclr", ["--seed", "1" * 24], "in ["),
    ("simclr", ["--device", "meta"], "--device cpu"),
    ("simclr", ["--device", "nonsense"], "--device cpu"),
    ("simclr", ["--image-size", "100000"], "memory"),  # one batch of images would need terabytes
    ("simclr", ["--queue-size", "10000000000"], "memory"),
    ("clip", ["--queue-size", "10000000000"], "memory"),
], ids=lambda value: " ".join(value) if isinstance(value, list) else value)
def test_options_that_cannot_build_or_allocate_exit_2_naming_flag_value_and_fix(tmp_path, capsys, mode, flags, cause):
    output = tmp_path / "run"
    assert main(["train", mode, *flags, "--output-dir", str(output)]) == errors.USAGE
    error = capsys.readouterr().err
    assert f"{flags[-2]} {flags[-1]}" in error and cause in error, error
    assert len(error.strip().splitlines()) == 1 and "Traceback" not in error
    assert not output.exists()


@pytest.mark.parametrize("seed", ["-900000", "1800000"])
def test_the_extreme_seeds_the_range_allows_train(tmp_path, tiny_args, seed):
    assert main(tiny_args("simclr", tmp_path, "--seed", seed, "--steps", "1")) == 0


@pytest.mark.parametrize("argv, fragments", [
    # past what a tensor's size can hold: torch's own TypeError on the meta device (found by tests/train/test_fuzz.py)
    (["--projection-dim", "99999999999999999999"], ["--projection-dim 99999999999999999999", "build no model"]),
    # a model whose weights alone exceed any machine: 10^10 x 16 floats
    (["--hidden-dim", "10000000000"], ["--hidden-dim 10000000000", "GiB of weights, more than the"]),
])
def test_model_sizes_past_memory_exit_2_naming_the_options(tmp_path, tiny_args, capsys, argv, fragments):
    output = tmp_path / "run"
    assert main(tiny_args("simclr", output, *argv)) == errors.USAGE
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1 and all(f in error for f in fragments), error
    assert not output.exists()
