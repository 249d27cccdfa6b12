"""The rows of `gradcache train vlm` (gradcache/train/data/vision_language/): every text format read alike, text
and image keys, image values (paths, lists, datasets' bytes), hard negatives paired by position, `<image>`
placeholders, the image root, the held-out split and the built-in shapes."""
from __future__ import annotations

import dataclasses
import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from gradcache.train.data.held_out import held_out_order, held_out_size
from gradcache.train.data.images.row_images import BadRowImage
from gradcache.train.data.images.shapes import render_shapes
from gradcache.train.data.text.usable_rows import UnusedNegatives
from gradcache.train.data.vision_language import (
    BUILT_IN_VLM, RowSide, load_vision_language_splits, opened_input,
)
from gradcache.train.data.vision_language.read_rows import read_rows
from gradcache.train.data.vision_language.stored_images import StoredImage
from gradcache.train.errors import DataError, UsageError
from tests.train.data.vision_language.row_files import png, row_of, vlm_config, write_rows

MIXED = [  # text -> image; image -> text with an image-only negative; image + text (placeholder) both sides
    {"query": "a cat", "query_image": None, "positive": None, "positive_image": "img/0.png", "negative": "a dog",
     "negative_image": "img/1.png"},
    {"query": None, "query_image": "img/2.png", "positive": "a red mat", "positive_image": None, "negative": None,
     "negative_image": "img/3.png"},
    {"query": "<image> sits on the mat", "query_image": "img/4.png", "positive": "a photo",
     "positive_image": "img/5.png", "negative": "blue tree", "negative_image": None},
    {"query": None, "query_image": None, "positive": "red", "positive_image": None, "negative": "x",
     "negative_image": None},  # no query: skipped
    {"query": "q", "query_image": None, "positive": "p", "positive_image": None, "negative": None,
     "negative_image": None},  # no hard negative where most rows have one: skipped
]
EXPECTED = [
    ((("a cat", (), None)), (None, ("img/0.png",), None), (("a dog", ("img/1.png",), None),)),
    ((None, ("img/2.png",), None), ("a red mat", (), None), ((None, ("img/3.png",), None),)),
    (("<image> sits on the mat", ("img/4.png",), None), ("a photo", ("img/5.png",), None),
     (("blue tree", (), None),)),
]
KEYS = dict(negative_keys=["negative"], negative_image_keys=["negative_image"])


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.jsonl.gz", "rows.csv", "rows.tsv", "rows.parquet", "rows"])
def test_every_format_gives_the_same_rows(tmp_path, name):
    path = write_rows(tmp_path / name, MIXED)
    with pytest.warns(UserWarning, match="skipped 2 of 5 rows"):
        read = read_rows(vlm_config(path, **KEYS), str(path), "--data", tmp_path.resolve())
    assert [row_of(row) for row in read.rows] == EXPECTED
    assert read.negatives_per_query == 1
    assert len(read.skipped) == 2
    assert "no query" in read.skipped[0] and "0 of 1 hard negatives" in read.skipped[1]
    first = {"rows.csv": "rows.csv line 2", "rows.tsv": "rows.tsv line 2", "rows.parquet": "rows.parquet row 1",
             "rows": "rows row 1"}.get(name, f"{name} line 1")
    assert read.rows[0].where == first


def test_lists_of_images_placeholders_and_negatives_paired_by_position(tmp_path):
    rows = [
        {"query": "<image> beside <image>", "query_image": ["a.png", "b.png"], "positive": "two",
         "negatives": ["n1", None, "n3"], "negative_images": ["c.png", ["d.png", "e.png"]]},
        {"query": "<image> alone", "query_image": ["a.png", "b.png"], "positive": "bad",
         "negatives": ["n1", "n2"]},  # one placeholder for two images: skipped
        {"query": "few", "positive": "p", "negatives": ["n1"]},  # 1 of 2 hard negatives: skipped
        {"query": 3, "positive": "p", "negatives": ["n1", "n2"]},  # not text: skipped
    ]
    path = write_rows(tmp_path / "rows.jsonl", rows)
    with pytest.warns(UserWarning, match="skipped 3 of 4 rows"):
        read = read_rows(vlm_config(path, negative_keys=["negatives"], negatives_per_query=2), str(path), "--data",
                         tmp_path.resolve())
    (row,) = read.rows
    assert row_of(row) == (("<image> beside <image>", ("a.png", "b.png"), None), ("two", (), None),
                           (("n1", ("c.png",), None), (None, ("d.png", "e.png"), None)))
    reasons = sorted(read.skipped)  # by line
    assert "line 2" in reasons[0] and "placeholders for 2 images" in reasons[0]
    assert "line 3" in reasons[1] and "1 of 2 hard negatives" in reasons[1]
    assert "line 4" in reasons[2] and "column 'query' holds int, not text" in reasons[2]


def test_several_negative_image_columns_hold_one_negative_each(tmp_path):
    rows = [{"query": "q", "positive": "p", "n1": "first", "i1": ["a.png", "b.png"], "i2": "c.png"}]
    path = write_rows(tmp_path / "rows.jsonl", rows)
    read = read_rows(vlm_config(path, negative_keys=["n1"], negative_image_keys=["i1", "i2"]), str(path), "--data",
                     tmp_path.resolve())
    assert row_of(read.rows[0])[2] == (("first", ("a.png", "b.png"), None), (None, ("c.png",), None))


def bytes_held(value) -> int:
    """The image bytes anywhere in `value` (rows, sides, lists, mappings, dataclasses); a StoredImage holds where
    its bytes lie and a 16-byte digest of them, none of the image."""
    if isinstance(value, StoredImage):
        return 0
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, dict):
        return sum(bytes_held(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(bytes_held(item) for item in value)
    if dataclasses.is_dataclass(value):
        return sum(bytes_held(getattr(value, field.name)) for field in dataclasses.fields(value))
    return 0


def assert_opens_as(side, root, pictures):
    opened = opened_input(side, root).images
    assert len(opened) == len(pictures)
    for image, picture in zip(opened, pictures):
        assert np.array_equal(np.asarray(image), np.asarray(Image.open(picture).convert("RGB")))


def test_image_bytes_in_parquet_stay_in_the_file_and_open_as_the_image(tmp_path):
    """Sides with lists of one and two images, negatives holding a list of image lists: every image is a
    StoredImage (no row holds bytes) that opens as the image, in a DataLoader worker too; the same image in two
    rows is one held-out candidate (its digest), two images are two."""
    import pyarrow
    from pyarrow import parquet

    from gradcache.train.eval.vision_language_retrieval import side_key

    pictures = [png(tmp_path / "made" / f"{k}.png", 9, 5 + k, seed=k) for k in range(4)]
    stored = [{"bytes": picture.read_bytes(), "path": picture.name} for picture in pictures]
    rows = [{"query": "a", "positive_image": [stored[0]], "negative": "n", "negative_images": [[stored[1], stored[2]]]},
            {"query": "b", "positive_image": [stored[3], stored[0]], "negative": "m",
             "negative_images": [[stored[0]]]},
            {"query": "c", "positive_image": [stored[0]], "negative": "o", "negative_images": [[stored[2]]]}]
    parquet.write_table(pyarrow.Table.from_pylist(rows), tmp_path / "rows.parquet", row_group_size=2)
    read = read_rows(vlm_config(tmp_path / "rows.parquet", negative_keys=["negative"]),
                     str(tmp_path / "rows.parquet"), "--data", tmp_path.resolve())
    assert bytes_held(read.rows) == 0
    assert all(isinstance(value, StoredImage) for row in read.rows
               for side in (row.query, row.positive, *row.negatives) for value in side.images)
    first, second, third = read.rows
    assert_opens_as(first.positive, tmp_path, pictures[:1])
    assert_opens_as(first.negatives[0], tmp_path, pictures[1:3])
    assert_opens_as(second.positive, tmp_path, [pictures[3], pictures[0]])
    assert_opens_as(third.negatives[0], tmp_path, pictures[2:3])  # a row of the second row group
    assert side_key(first.positive) == side_key(third.positive)
    assert side_key(first.positive) != side_key(first.negatives[0])
    worker = torch.utils.data.DataLoader(read.rows, batch_size=None, num_workers=1,
                                         collate_fn=lambda row: np.asarray(opened_input(row.positive,
                                                                                        tmp_path).images[0]))
    assert [image.shape for image in worker] == [np.asarray(Image.open(pictures[k]).convert("RGB")).shape
                                                  for k in (0, 3, 0)]


def test_a_datasets_image_column_stays_in_the_folder_and_opens_as_the_image(tmp_path):
    import datasets

    pictures = [png(tmp_path / "made" / f"{k}.png", 6, 7, seed=k) for k in range(3)]
    features = datasets.Features({"query": datasets.Value("string"), "positive_image": datasets.Image()})
    folder = tmp_path / "set"
    datasets.Dataset.from_dict({"query": ["a", "b", "c"], "positive_image": [
        {"bytes": path.read_bytes(), "path": None} for path in pictures]}, features=features).save_to_disk(str(folder))
    read = read_rows(vlm_config(folder), str(folder), "--data", tmp_path.resolve())
    assert bytes_held(read.rows) == 0
    for row, path in zip(read.rows, pictures):
        assert_opens_as(row.positive, tmp_path, [path])


def test_paths_resolve_under_image_root_and_never_leave_it(tmp_path):
    root = tmp_path / "pictures"
    picture = png(root / "x.png", seed=4)
    png(tmp_path / "outside.png")
    data = write_rows(tmp_path / "data" / "rows.jsonl", [{"query": "q", "positive_image": "x.png"},
                                                        {"query": "r", "positive_image": "../outside.png"}])
    with pytest.warns(UserWarning, match="left out 1 of 2 held-out rows"):
        splits = load_vision_language_splits(vlm_config(data, image_root=str(root), eval_data=str(data)))
    assert splits.image_root == root.resolve()
    (image,) = opened_input(splits.train[0].positive, splits.image_root).images
    assert np.array_equal(np.asarray(image), np.asarray(Image.open(picture).convert("RGB")))
    with pytest.raises(BadRowImage, match="leaves the image root"):
        opened_input(splits.train[1].positive, splits.image_root)


def test_eval_data_in_another_folder_resolves_under_its_own(tmp_path):
    png(tmp_path / "train" / "x.png")
    png(tmp_path / "held" / "y.png", seed=1)
    data = write_rows(tmp_path / "train" / "rows.jsonl", [{"query": "q", "positive_image": "x.png"}] * 3)
    held = write_rows(tmp_path / "held" / "rows.jsonl", [{"query": "h", "positive_image": "y.png"}])
    splits = load_vision_language_splits(vlm_config(data, eval_data=str(held)))
    assert splits.image_root == (tmp_path / "train").resolve() and len(splits.train) == 3
    assert [row.positive.root for row in splits.test] == [(tmp_path / "held").resolve()]
    assert opened_input(splits.test[0].positive, splits.image_root).images[0].size == (8, 8)


def test_a_key_given_that_no_row_has_is_refused_naming_it_and_the_columns(tmp_path):
    path = write_rows(tmp_path / "rows.jsonl", [{"query": "q", "positive": "p"}] * 3)
    with pytest.raises(DataError, match=r"no column 'picture' \(columns: \['positive', 'query'\]\).*--query-image-key"):
        load_vision_language_splits(vlm_config(path, query_image_key="picture"))
    with pytest.raises(DataError, match=r"no column 'hard'.*--negative-keys"):
        load_vision_language_splits(vlm_config(path, negative_keys=["hard"]))
    png(tmp_path / "a.png")
    image_only = write_rows(tmp_path / "images.jsonl", [{"query_image": "a.png", "positive": "p"}] * 3)
    assert load_vision_language_splits(vlm_config(image_only, test_size=1)).train[0].query == RowSide(None, ("a.png",))
    neither = write_rows(tmp_path / "neither.jsonl", [{"text": "q", "positive": "p"}] * 3)
    with pytest.raises(DataError, match="neither a query text column 'query' nor a query image column"):
        load_vision_language_splits(vlm_config(neither))
    with pytest.raises(UsageError, match="--negatives-per-query 1 needs hard negatives"):
        load_vision_language_splits(vlm_config(path, negatives_per_query=1))


def test_hard_negative_columns_no_key_names_are_warned_of_as_the_text_mode_does(tmp_path):
    """A column named like hard negatives that --negative-keys leaves out: the run would train without it, so the
    text mode's warning names it and the flag; named, or an image column (negative_images), no warning."""
    rows = [{"query": "q", "positive": "p", "hard_negative": "n", "negative_images": None}] * 3
    path = write_rows(tmp_path / "rows.jsonl", rows)
    with pytest.warns(UnusedNegatives, match=r"hard-negative columns that no --negative-keys names \('hard_negative'\)"
                      r".*--negative-keys hard_negative"):
        read_rows(vlm_config(path), str(path), "--data", tmp_path.resolve())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnusedNegatives)
        read = read_rows(vlm_config(path, negative_keys=["hard_negative"]), str(path), "--data", tmp_path.resolve())
    assert read.negatives_per_query == 1


def test_no_usable_row_is_refused(tmp_path):
    path = write_rows(tmp_path / "rows.jsonl", [{"query": "", "positive": "p"}] * 3)
    with pytest.warns(UserWarning), pytest.raises(DataError, match="has no row with a query.*the first left out"):
        load_vision_language_splits(vlm_config(path))


@pytest.mark.parametrize("seed", [0, 5])
def test_held_out_rows_follow_the_text_rule_and_never_train(tmp_path, seed):
    rows = [{"query": f"q{k}", "positive": f"p{k}"} for k in range(53)]
    path = write_rows(tmp_path / "rows.jsonl", rows)
    splits = load_vision_language_splits(vlm_config(path, data_seed=seed))
    size = held_out_size(None, 53, "rows")
    order = held_out_order(53, size, seed, "rows").tolist()
    assert [row.query.text for row in splits.test] == [f"q{k}" for k in order[:size]]
    assert [row.query.text for row in splits.train] == [f"q{k}" for k in order[size:]]
    assert not {row.where for row in splits.test} & {row.where for row in splits.train}
    assert len(load_vision_language_splits(vlm_config(path, data_seed=seed, test_size=7)).test) == 7
    with pytest.raises(DataError, match="--test-size"):
        load_vision_language_splits(vlm_config(path, test_size=53))


def test_held_out_rows_whose_images_fail_are_left_out_and_counted(tmp_path):
    png(tmp_path / "ok.png")
    (tmp_path / "broken.png").write_text("not an image")
    path = write_rows(tmp_path / "rows.jsonl", [{"query": "q", "positive_image": "ok.png"}] * 4)
    held = write_rows(tmp_path / "held.jsonl", [{"query": "a", "positive_image": "ok.png"},
                                                {"query": "b", "positive_image": "broken.png"}])
    with pytest.warns(UserWarning, match="left out 1 of 2 held-out rows"):
        splits = load_vision_language_splits(vlm_config(path, eval_data=str(held)))
    assert [row.query.text for row in splits.test] == ["a"]
    assert len(splits.train.skipped) == 1 and "held.jsonl line 2" in splits.train.skipped[0]


def test_built_in_rows_are_the_shapes_in_three_kinds(tmp_path):
    splits = load_vision_language_splits(vlm_config(BUILT_IN_VLM, train_size=7, test_size=4, data_seed=2))
    shapes, held = render_shapes(7, 32, seed=2), render_shapes(4, 32, seed=2 + 1_000_003)

    def pixels(image: Image.Image) -> torch.Tensor:
        return torch.from_numpy(np.array(image)).permute(2, 0, 1)

    assert splits.negatives_per_query == 0 and splits.image_root is None and splits.name == BUILT_IN_VLM
    for index, row in enumerate(splits.train):
        caption, image = shapes.captions[index], shapes.images[index]
        kind = index % 3
        picture = (row.query if kind != 1 else row.positive).images[0]
        assert torch.equal(pixels(picture), image) and picture.size == (32, 32)
        if kind == 0:
            assert (row.query.text, row.positive.text, row.positive.images) == (None, caption, ())
        elif kind == 1:
            assert (row.query.text, row.query.images) == (caption, ())
        else:
            assert row.query.text == " ".join(caption.split()[4:]) and row.positive.text == caption
            assert row.query.text.startswith(("in the", "on the", "at the"))
    assert [row.positive.text for row in splits.test] == held.captions
    assert all(torch.equal(pixels(row.query.images[0]), image) for row, image in zip(splits.test, held.images))
    assert opened_input(splits.test[0].query, None).images[0] is splits.test[0].query.images[0]


def test_train_num_samples_is_refused(tmp_path):
    with pytest.raises(UsageError, match="drop --train-num-samples"):
        load_vision_language_splits(vlm_config(BUILT_IN_VLM, train_num_samples=10))


def test_bytes_value_that_is_no_image_is_bad_data(tmp_path):
    side = RowSide(None, ({"bytes": b"\x89PNG nothing", "path": "n.png"},))
    with pytest.raises(BadRowImage, match="does not decode"):
        opened_input(side, tmp_path)
    buffer = io.BytesIO()
    Image.new("RGB", (3, 4), (9, 8, 7)).save(buffer, format="PNG")
    assert opened_input(RowSide("t", ({"bytes": buffer.getvalue(), "path": None},)), None).images[0].size == (3, 4)


def test_shards_in_several_folders_resolve_under_their_own(tmp_path):
    for part in ("a", "b"):
        png(tmp_path / part / "x.png", 5 + (part == "b"), 5)
        write_rows(tmp_path / part / "rows.jsonl", [{"query": f"q{k}", "positive_image": "x.png"} for k in range(3)])
    splits = load_vision_language_splits(vlm_config(tmp_path / "*" / "rows.jsonl", eval_data=str(
        tmp_path / "a" / "rows.jsonl")))
    assert splits.image_root == (tmp_path / "a").resolve() and len(splits.train) == 6
    assert [row.positive.root for row in splits.train] == [None] * 3 + [(tmp_path / "b").resolve()] * 3
    widths = [opened_input(row.positive, splits.image_root).images[0].size[0] for row in splits.train]
    assert widths == [5, 5, 5, 6, 6, 6]
