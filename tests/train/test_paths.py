"""Paths given relative to where a run started are stored absolute, so the run folder means the same from any
directory: `gradcache eval RUN` from elsewhere reads the run's data, and `--resume` with the same relative
`--data` is the same option."""
import json

from PIL import Image

from gradcache.cli import main
from gradcache.train.checkpoints.atomic import load_checkpoint


def _image_folder(root):
    for label, colour in (("red", (220, 20, 20)), ("blue", (20, 20, 220))):
        (root / label).mkdir(parents=True)
        for index in range(24):
            Image.new("RGB", (16, 16), tuple(c + index for c in colour)).save(root / label / f"{index}.png")


def test_a_relative_data_path_is_stored_absolute_and_eval_works_from_another_directory(tmp_path, monkeypatch,
                                                                                         tiny_args):
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    _image_folder(start / "images")
    elsewhere.mkdir()
    monkeypatch.chdir(start)
    argv = tiny_args("simclr", "run", "--steps", "2", "--checkpoint-every", "1")
    argv[argv.index("--test-size") + 1] = "8"
    argv[argv.index("--train-size") + 1] = "40"
    argv += ["--data", "images"]
    assert main(argv) == 0
    stored = load_checkpoint(start / "run")["args"]["data"]
    assert stored == str((start / "images").resolve())
    monkeypatch.chdir(elsewhere)
    assert main(["eval", str(start / "run"), "--output", "metrics.json"]) == 0
    assert "knn_top1" in json.loads((elsewhere / "metrics.json").read_text())
    monkeypatch.chdir(start)  # the same relative --data on a resume is the same option, not another one
    assert main(["train", "simclr", "--resume", "run", "--data", "images", "--steps", "3", "--quiet",
                 "--workers", "0"]) == 0
