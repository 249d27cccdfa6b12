"""An exported open_clip folder (RUN/model) as MODEL of `gradcache encode` and `gradcache eval --classes`: loaded by
open_clip itself, it embeds images and texts as the run folder does (float32 rounding) and scores the same
zero-shot accuracy."""
import json

import numpy as np
import pytest

from gradcache.cli import main
from tests.train.commands.test_eval_zero_shot import image_folder

open_clip = pytest.importorskip("open_clip")

from tests.train.test_open_clip_mode import RUN, tiny_architecture  # noqa: F401  (the one-block architecture)


@pytest.mark.slow
def test_encode_and_zero_shot_of_the_export_equal_the_run_folders(tmp_path, capsys, tiny_architecture):  # noqa: F811
    run = tmp_path / "run"
    assert main([*RUN[:3], f"open_clip:{tiny_architecture}", *RUN[4:], "--output-dir", str(run)]) == 0
    assert (run / "model" / "open_clip_model.safetensors").is_file()
    folder = image_folder(tmp_path / "images", per_class=2)
    (tmp_path / "texts.txt").write_text("a red square\na small blue circle\ngreen\n")
    (tmp_path / "classes.txt").write_text("red\ngreen\tthe {}\nblue\n")
    for source in (run, run / "model"):
        name = source.name
        assert main(["encode", str(source), "--data", str(folder), "--output", str(tmp_path / f"{name}_i.npy")]) == 0
        assert main(["encode", str(source), "--data", str(tmp_path / "texts.txt"),
                     "--output", str(tmp_path / f"{name}_t.npy")]) == 0
        capsys.readouterr()
        assert main(["eval", str(source), "--data", str(folder), "--classes", str(tmp_path / "classes.txt")]) == 0
        (tmp_path / f"{name}.json").write_text(capsys.readouterr().out)
    for suffix in ("_i.npy", "_t.npy"):
        want, got = np.load(tmp_path / f"run{suffix}"), np.load(tmp_path / f"model{suffix}")
        assert got.shape == want.shape and got.shape[0] in (3, 6)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert json.loads((tmp_path / "model.json").read_text()) == json.loads((tmp_path / "run.json").read_text())


def test_an_open_clip_too_old_for_local_dir_is_named_not_the_folder(tmp_path, capsys, monkeypatch):
    from gradcache.train.model_folders import OPEN_CLIP_CONFIG, OPEN_CLIP_WEIGHTS

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / OPEN_CLIP_CONFIG).write_text("{}")
    (folder / OPEN_CLIP_WEIGHTS).write_bytes(b"")
    (tmp_path / "texts.txt").write_text("a red square\n")
    monkeypatch.setattr(open_clip, "__version__", "2.24.0")
    assert main(["encode", str(folder), "--data", str(tmp_path / "texts.txt"),
                 "--output", str(tmp_path / "out.npy")]) == 2
    err = capsys.readouterr().err
    assert "open-clip-torch 3.0" in err and "2.24.0" in err and "gradcache[open-clip]" in err


@pytest.mark.parametrize("change", ["huge width", "corrupt header"])
def test_a_tampered_open_clip_folder_is_refused_before_it_is_built(tmp_path, capsys, tiny_architecture,  # noqa: F811
                                                                    change):
    from safetensors.torch import save_file

    from gradcache.train.model_folders import OPEN_CLIP_CONFIG, OPEN_CLIP_WEIGHTS

    folder = tmp_path / "model"
    folder.mkdir()
    model = open_clip.create_model(tiny_architecture)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / OPEN_CLIP_WEIGHTS)
    model_cfg = open_clip.get_model_config(tiny_architecture)
    if change == "huge width":
        model_cfg["text_cfg"] = {**model_cfg["text_cfg"], "width": 4_000_000}  # terabytes of text tower
    (folder / OPEN_CLIP_CONFIG).write_text(json.dumps({"model_cfg": model_cfg, "preprocess_cfg": {}}))
    if change == "corrupt header":
        data = (folder / OPEN_CLIP_WEIGHTS).read_bytes()
        (folder / OPEN_CLIP_WEIGHTS).write_bytes(data[:8] + b"{not json" + data[17:])
    (tmp_path / "texts.txt").write_text("a red square\n")
    assert main(["encode", str(folder), "--data", str(tmp_path / "texts.txt"),
                 "--output", str(tmp_path / "out.npy")]) == 2
    err = capsys.readouterr().err
    assert str(folder / OPEN_CLIP_WEIGHTS) in err and len(err.strip().splitlines()) == 1, err
    assert ("does not hold the model" if change == "huge width" else "corrupt safetensors header") in err
    assert not (tmp_path / "out.npy").exists()
