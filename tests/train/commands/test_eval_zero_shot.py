"""`gradcache eval CLIP_MODEL --data FOLDER --classes FILE`: zero-shot top-1 against a brute-force computation
(one image and one prompt at a time, cosine by hand, argmax by a loop), and a class folder missing from FILE
refused with exit status 2, naming it."""
import json

import numpy as np
import pytest
import torch

from gradcache.cli import main

CLASSES = ["red", "green", "blue"]


def image_folder(root, per_class=3, seed=0):
    """root/<class>/<i>.png, random 18 x 22 images (decoded to the run's 16 x 16 by a resize and a centre crop)."""
    from PIL import Image

    generator = np.random.default_rng(seed)
    for name in CLASSES:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = generator.integers(0, 256, (18, 22, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def test_zero_shot_top1_equals_a_brute_force_argmax(tmp_path, tiny_args, capsys):
    from gradcache.models import ByteTokenizer

    from gradcache.train.commands.model import load_run
    from gradcache.train.data.images.augment import to_model_input
    from gradcache.train.data.images.files import decode_image

    assert main(tiny_args("clip", tmp_path / "run")) == 0
    folder = image_folder(tmp_path / "images")
    # FILE: its own order, a class with two templates, one with the default, and an extra candidate class
    (tmp_path / "classes.txt").write_text("# colours\nblue\ta photo of a {}.\ta {} thing\n\nyellow\nred\tthe {}\n"
                                          "green\n")
    candidates = {"blue": ["a photo of a blue.", "a blue thing"], "yellow": ["a photo of a yellow."],
                  "red": ["the red"], "green": ["a photo of a green."]}
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--data", str(folder), "--classes", str(tmp_path / "classes.txt"),
                 "--output", str(tmp_path / "zero_shot.json")]) == 0
    got = json.loads(capsys.readouterr().out)
    assert json.loads((tmp_path / "zero_shot.json").read_text()) == got

    config, model, _ = load_run(tmp_path / "run")
    tokenize = ByteTokenizer(config.context_length)

    def unit(vector):
        vector = vector[0].double().numpy()
        return vector / np.sqrt(sum(value * value for value in vector))

    with torch.no_grad():
        classes = {}
        for name, prompts in candidates.items():
            mean = np.mean([unit(model.encode_text(**tokenize([prompt]))) for prompt in prompts], axis=0)
            classes[name] = mean / np.linalg.norm(mean)
        hits = 0
        for name in CLASSES:
            for path in sorted((folder / name).iterdir()):
                image = unit(model.encode_image(to_model_input(decode_image(path, config.image_size))[None]))
                scores = {candidate: float(image @ embedding) for candidate, embedding in classes.items()}
                hits += max(scores, key=scores.get) == name
    assert got["zero_shot_top1"] == pytest.approx(100 * hits / 9)
    assert got["images"] == 9 and got["classes"] == 4


def test_a_class_folder_missing_from_the_file_exits_2_naming_it(tmp_path, tiny_args, capsys):
    assert main(tiny_args("clip", tmp_path / "run")) == 0
    folder = image_folder(tmp_path / "images", per_class=1)
    (tmp_path / "classes.txt").write_text("red\nblue\n")
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--data", str(folder), "--classes", str(tmp_path / "classes.txt"),
                 "--output", str(tmp_path / "zero_shot.json")]) == 2
    assert "'green'" in capsys.readouterr().err
    assert not (tmp_path / "zero_shot.json").exists()
