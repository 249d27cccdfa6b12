"""`gradcache encode`: rows in input order, L2-normalised, equal to a one-at-a-time reference; .npy and .faiss."""
import io
import json

import numpy as np
import pytest
import torch

from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.checkpoints.atomic import load_checkpoint
from tests.train.commands.conftest import Reference
from tests.train.shard_files import write_shard

# lengths out of order, so the length-sorted batches must be put back in the input's order
TEXTS = ["a much longer text that pads every other one in its batch", "short", "a middling text here", "x",
         "another fairly long text, longer than most", "mid length text"]


def test_text_rows_in_input_order_and_normalised(tmp_path, tiny_bert):
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    assert main(["encode", str(tiny_bert), "--data", str(tmp_path / "texts.txt"), "--output",
                 str(tmp_path / "e.npy"), "--batch-size", "4"]) == 0
    embeddings = np.load(tmp_path / "e.npy")
    assert embeddings.dtype == np.float32 and embeddings.shape == (len(TEXTS), 16)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(embeddings, Reference(tiny_bert)(TEXTS), atol=2e-6)


@pytest.mark.slow
def test_a_table_column_of_a_run_to_a_faiss_index(tmp_path, text_run, tiny_bert):
    faiss = pytest.importorskip("faiss")
    with open(tmp_path / "rows.jsonl", "w") as handle:
        handle.writelines(json.dumps({"id": i, "body": text}) + "\n" for i, text in enumerate(TEXTS))
    assert main(["encode", str(text_run), "--data", str(tmp_path / "rows.jsonl"), "--key", "body",
                 "--output", str(tmp_path / "e.faiss")]) == 0
    index = faiss.read_index(str(tmp_path / "e.faiss"))
    reference = Reference(tiny_bert, load_checkpoint(text_run)["model"], max_length=24)(TEXTS).astype(np.float32)
    assert index.ntotal == len(TEXTS)
    stored = np.stack([index.reconstruct(row) for row in range(len(TEXTS))])  # by id: the input's row numbers
    np.testing.assert_allclose(stored, reference, atol=2e-6)
    _, ids = index.search(reference, 1)
    assert ids[:, 0].tolist() == list(range(len(TEXTS)))


def test_images_of_a_simclr_run_in_path_order(tmp_path, tiny_args):
    from PIL import Image

    from gradcache.train.commands.model import load_run
    from gradcache.train.data.images.augment import to_model_input
    from gradcache.train.data.images.files import decode_image

    assert main(tiny_args("simclr", tmp_path / "run")) == 0
    generator = np.random.default_rng(0)
    folder = tmp_path / "images"
    (folder / "b").mkdir(parents=True)
    names = ["b/2.png", "a.png", "b/1.png", "c.png"]
    for name in names:
        Image.fromarray(generator.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(folder / name)
    assert main(["encode", str(tmp_path / "run"), "--data", str(folder), "--output", str(tmp_path / "e.npy")]) == 0
    _, model, _ = load_run(tmp_path / "run")
    with torch.no_grad():
        want = [torch.nn.functional.normalize(model.embed(to_model_input(decode_image(folder / name, 16))[None]),
                                              dim=1)[0].numpy() for name in sorted(names)]
    np.testing.assert_allclose(np.load(tmp_path / "e.npy"), np.stack(want), atol=2e-6)
    # the run's export (RUN/model, gradcache.models.from_pretrained) embeds them the same
    assert main(["encode", str(tmp_path / "run" / "model"), "--data", str(folder), "--output",
                 str(tmp_path / "exported.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "exported.npy"), np.stack(want), atol=2e-6)
    assert main(["eval", str(tmp_path / "run" / "model"), "--data", str(folder)]) == errors.USAGE  # needs the run


def _png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()




@pytest.mark.slow
def test_shards_embed_as_the_same_images_in_a_folder_in_shard_then_member_order(tmp_path, tiny_args, capsys):
    assert main(tiny_args("simclr", tmp_path / "run")) == 0
    generator = np.random.default_rng(1)
    # keys out of alphabetical order inside each shard: the rows must follow the members, not the keys
    layout = {"part-000.tar": ["z", "a", "m"], "part-001.tar": ["q", "BAD", "c", "b"]}
    shards, folder = tmp_path / "shards", tmp_path / "images"
    shards.mkdir()
    folder.mkdir()
    row = 0
    for shard, keys in layout.items():
        samples = []
        for key in keys:
            if key == "BAD":
                samples.append((key, {"png": b"not a png", "cls": b"0"}))
                continue
            png = _png(generator.integers(0, 256, (20, 24, 3), dtype=np.uint8))
            samples.append((key, {"png": png, "cls": b"1"}))
            (folder / f"{row:02d}.png").write_bytes(png)  # the folder's sorted order = shard then member order
            row += 1
        write_shard(shards / shard, samples)
    assert main(["encode", str(tmp_path / "run"), "--data", str(folder), "--output", str(tmp_path / "f.npy")]) == 0
    want = np.load(tmp_path / "f.npy")
    assert want.shape[0] == 6
    for name, spec in [("folder", shards), ("brace", shards / "part-{000..001}.tar"), ("glob", shards / "*.tar")]:
        capsys.readouterr()
        assert main(["encode", str(tmp_path / "run"), "--data", str(spec), "--output", str(tmp_path / f"{name}.npy"),
                     "--batch-size", "4"]) == 0
        np.testing.assert_array_equal(np.load(tmp_path / f"{name}.npy"), want)
        err = capsys.readouterr().err
        assert "skipped 1 shard samples" in err and "part-001.tar:BAD" in err, name
    assert main(["encode", str(tmp_path / "run"), "--data", str(shards / "part-001.tar"), "--output",
                 str(tmp_path / "one.npy")]) == 0
    err = capsys.readouterr().err
    assert "skipped 1 shard samples" in err and "part-001.tar:BAD" in err
    np.testing.assert_array_equal(np.load(tmp_path / "one.npy"), want[3:])
    assert main(["encode", str(tmp_path / "run"), "--data", str(shards / "part-9*.tar"), "--output",
                 str(tmp_path / "none.npy")]) == errors.USAGE
    assert "matches no shard" in capsys.readouterr().err and not (tmp_path / "none.npy").exists()


@pytest.mark.parametrize("case", ["empty file", "table without key", "missing key", "images for a text model",
                                  "shards for a text model", "bad output"])
def test_bad_input_exits_2_naming_it_and_writes_nothing(capsys, tmp_path, tiny_bert, case):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "rows.csv").write_text("id,body\n1,hello\n")
    (tmp_path / "images").mkdir()
    argv, named = {
        "empty file": (["--data", str(tmp_path / "empty.txt")], "holds no text"),
        "table without key": (["--data", str(tmp_path / "rows.csv")], "--key"),
        "missing key": (["--data", str(tmp_path / "rows.csv"), "--key", "text"], "no column 'text'"),
        "images for a text model": (["--data", str(tmp_path / "images")], "holds images"),
        "shards for a text model": (["--data", str(tmp_path / "part-{000..001}.tar")], "holds images"),
        "bad output": (["--data", str(tmp_path / "rows.csv"), "--key", "body", "--output", str(out / "e.pt")],
                       "unknown extension"),
    }[case]
    output = [] if "--output" in argv else ["--output", str(out / "e.npy")]
    capsys.readouterr()
    assert main(["encode", str(tiny_bert), *argv, *output]) == errors.USAGE
    assert named in capsys.readouterr().err
    assert list(out.iterdir()) == []


def test_query_and_passage_folders_embed_each_side_with_its_own_tower(tmp_path):
    from tests.tiny_text_model import write_tiny_bert

    for seed, side in enumerate(["query", "passage"]):
        write_tiny_bert(tmp_path / "towers" / side, seed=seed, sentence_transformers={"pooling_mode_mean_tokens": True})
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS))
    for side in ("query", "passage"):
        assert main(["encode", str(tmp_path / "towers"), "--data", str(tmp_path / "texts.txt"), "--tower", side,
                     "--output", str(tmp_path / f"{side}.npy")]) == 0
        np.testing.assert_allclose(np.load(tmp_path / f"{side}.npy"),
                                   Reference(tmp_path / "towers" / side)(TEXTS), atol=2e-6)


@pytest.mark.parametrize("value, named", [(5, "int"), ({"a": "b"}, "dict"), (["x"], "list")])
def test_a_value_that_is_not_text_is_refused_naming_the_row_not_embedded_as_its_python_spelling(
        tmp_path, tiny_bert, capsys, value, named):
    rows = [{"body": "a text"}, {"body": None}, {"body": value}]  # null: an empty text, embedded as such
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["encode", str(tiny_bert), "--data", str(tmp_path / "rows.jsonl"), "--key", "body", "--output",
                 str(tmp_path / "e.npy")]) == errors.USAGE
    err = capsys.readouterr().err
    assert "rows.jsonl line 3: column 'body' holds " + named + ", not text" in err, err
    assert not (tmp_path / "e.npy").exists()
