"""A model folder whose weights hold NaN or inf (issue 40 item 5): `gradcache encode`, `eval` and `mine` exit 2
naming the weight, with nothing written (they encoded every text to NaN and exited 0), and `gradcache train text
--model` exits 2 before its first step. The weights are checked once the model is loaded, whatever its kind."""
import shutil

import pytest
from safetensors.torch import load_file, save_file

from gradcache.cli import main
from gradcache.train import errors

POISONED = "encoder.layer.0.attention.self.query.weight"

# case -> (planted value, command, expected status, message fragment)
CASES = {
    "encode, a NaN weight": (float("nan"), "encode", errors.USAGE, f"{POISONED} (1 of 256 values)"),
    "encode, an inf weight": (float("inf"), "encode", errors.USAGE, f"{POISONED} (1 of 256 values)"),
    "eval, a NaN weight": (float("nan"), "eval", errors.USAGE, f"{POISONED} (1 of 256 values)"),
    "mine, a NaN weight": (float("nan"), "mine", errors.USAGE, f"{POISONED} (1 of 256 values)"),
    "encode, finite weights": (None, "encode", errors.OK, ""),
}


def poisoned_copy(tiny_bert, folder, value):
    """`tiny_bert` copied to `folder`, one entry of one weight replaced by `value` (None: left as it is)."""
    shutil.copytree(tiny_bert, folder)
    if value is not None:
        weights = load_file(folder / "model.safetensors")
        name = next(key for key in weights if key.endswith(POISONED))
        weights[name][0, 0] = value
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def _command(command, folder, tmp_path, pairs_file):
    output = tmp_path / {"encode": "out.npy", "eval": "metrics.json", "mine": "mined.jsonl"}[command]
    texts = tmp_path / "texts.txt"
    texts.write_text("a query\nanother text\n")
    data = {"encode": str(texts), "eval": str(pairs_file), "mine": str(pairs_file)}[command]
    extra = {"encode": [], "eval": ["--negative-keys", "hard"], "mine": ["--negatives", "1"]}[command]
    return [command, str(folder), "--data", data, "--output", str(output), *extra], output


@pytest.mark.parametrize("case", CASES)
def test_non_finite_weights_exit_2_naming_the_weight(tmp_path, tiny_bert, pairs_file, capsys, case):
    value, command, status, fragment = CASES[case]
    folder = poisoned_copy(tiny_bert, tmp_path / "bert", value)
    argv, output = _command(command, folder, tmp_path, pairs_file)
    assert main(argv) == status, capsys.readouterr().err
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err, err
    if status != errors.OK:
        assert f"MODEL {folder}" in err and "NaN or inf" in err, err
        assert not output.exists()


def test_train_refuses_a_non_finite_model_before_its_first_step(tmp_path, tiny_bert, capsys):
    from tests.train.conftest import text_args

    folder = poisoned_copy(tiny_bert, tmp_path / "bert", float("nan"))
    assert main(text_args(folder, tmp_path / "run")) == errors.USAGE
    err = capsys.readouterr().err
    assert f"--model {folder}" in err and f"{POISONED} (1 of 256 values)" in err, err
    run = tmp_path / "run"  # the run's lock alone: no log, no checkpoint, no model
    assert not run.exists() or [path.name for path in run.iterdir()] == [".lock"]
