"""`gradcache eval CLIP_RUN --data TABLE`: the run's recall on another file, against a brute-force loop over
embeddings computed one image and one caption at a time."""
import json

import numpy as np
import pytest
import torch

from gradcache.cli import main


def test_a_clip_run_on_another_caption_table(tmp_path, tiny_args, capsys):
    from gradcache.models import ByteTokenizer
    from PIL import Image

    from gradcache.train.commands.model import load_run
    from gradcache.train.data.images.augment import to_model_input
    from gradcache.train.data.images.files import decode_image

    assert main(tiny_args("clip", tmp_path / "run")) == 0
    generator = np.random.default_rng(0)
    (tmp_path / "images").mkdir()
    captions = [f"a picture numbered {i}" for i in range(12)]
    lines = ["filepath\ttitle"]
    for i, caption in enumerate(captions):
        Image.fromarray(generator.integers(0, 256, (18, 22, 3), dtype=np.uint8)).save(tmp_path / "images" / f"{i}.png")
        lines.append(f"images/{i}.png\t{caption}")
    (tmp_path / "table.tsv").write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--data", str(tmp_path / "table.tsv"), "--test-size", "11"]) == 0
    got = json.loads(capsys.readouterr().out)

    # the held-out rows: the first 11 of the permutation seeded by the run's --data-seed (0)
    held_out = torch.randperm(12, generator=torch.Generator().manual_seed(0))[:11].tolist()
    config, model, _ = load_run(tmp_path / "run")
    tokenize = ByteTokenizer(config.context_length)
    with torch.no_grad():
        images = [torch.nn.functional.normalize(model.encode_image(to_model_input(
            decode_image(tmp_path / "images" / f"{i}.png", 16))[None]), dim=1)[0].double().numpy() for i in held_out]
        texts = [torch.nn.functional.normalize(model.encode_text(**tokenize([captions[i]])), dim=1)[0].double().numpy()
                 for i in held_out]
    for k in (1, 5, 10):
        image_to_text = np.mean([sum(images[a] @ texts[b] > images[a] @ texts[a] for b in range(11)) < k
                                 for a in range(11)])
        text_to_image = np.mean([sum(texts[a] @ images[b] > texts[a] @ images[a] for b in range(11)) < k
                                 for a in range(11)])
        assert got[f"image_to_text_recall@{k}"] == pytest.approx(100 * image_to_text), k
        assert got[f"text_to_image_recall@{k}"] == pytest.approx(100 * text_to_image), k
    assert 0 < got["image_to_text_recall@1"] < 100 or 0 < got["text_to_image_recall@1"] < 100  # not trivially equal
