import pytest
import torch
from PIL import Image

from gradcache.train.data.images.files import (
    decode_image,
    load_caption_table,
    load_digits,
    load_image_folder,
)
from gradcache.train.errors import DataError


def _write_png(path, colour, size=(20, 12)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)


def test_digits_ships_with_scikit_learn():
    splits = load_digits(image_size=16, test_size=100, seed=0)
    assert splits.train.images.shape[1:] == (3, 16, 16) and len(splits.test) == 100
    assert len(splits.train) + len(splits.test) == 1797
    assert splits.train.captions[0].startswith("a handwritten digit")


def test_decode_resizes_the_short_side_and_centre_crops(tmp_path):
    path = tmp_path / "wide.png"
    image = Image.new("RGB", (40, 20), (255, 0, 0))
    image.paste((0, 0, 255), (0, 0, 10, 20))  # a blue band at the far left is cropped away
    image.save(path)
    decoded = decode_image(path, 10)
    assert decoded.shape == (3, 10, 10) and decoded.dtype == torch.uint8
    assert decoded[0].float().mean() > 200 and decoded[2].float().mean() < 30


def test_image_folder_labels_from_sorted_class_folders(tmp_path):
    for index in range(6):
        _write_png(tmp_path / "cat" / f"{index}.png", (200, 10, 10))
        _write_png(tmp_path / "dog" / f"{index}.png", (10, 10, 200))
    splits = load_image_folder(tmp_path, image_size=8, test_size=4, seed=0)
    assert splits.train.class_names == ["cat", "dog"]
    for images in (splits.train.decoded("training"), splits.test):
        red = images.images[:, 0].float().mean((1, 2)) > 100
        assert torch.equal(red, images.labels == 0)


def test_undecodable_image_is_skipped_counted_and_named(tmp_path):
    for index in range(4):
        _write_png(tmp_path / "a" / f"{index}.png", (1, 2, 3))
    (tmp_path / "a" / "broken.png").write_bytes(b"not a png")
    with pytest.warns(UserWarning, match="broken.png"):  # every image held out: decoded at load
        splits = load_image_folder(tmp_path, image_size=8, test_size=4, seed=0)
    assert len(splits.test) == 3 and len(splits.train) == 1  # the training file is not read until drawn
    assert [name.endswith("broken.png") for name in splits.train.skipped] == [True]


def test_missing_or_empty_folder_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="not a directory"):
        load_image_folder(tmp_path / "nowhere", 8, 1, 0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no images"):
        load_image_folder(tmp_path / "empty", 8, 1, 0)


def test_caption_table_relative_paths_and_separator(tmp_path):
    for index in range(5):
        _write_png(tmp_path / "img" / f"{index}.png", (index * 40, 0, 0))
    rows = "\n".join(f"img/{i}.png\tcaption {i}" for i in range(5))
    (tmp_path / "pairs.tsv").write_text(f"filepath\ttitle\n{rows}\n")
    splits = load_caption_table(tmp_path / "pairs.tsv", image_size=8, test_size=2, seed=0)
    for images in (splits.train.decoded("training"), splits.test):
        for image, caption in zip(images.images, images.captions):
            assert round(image[0].float().mean().item() / 40) == int(caption.split()[1])


def test_caption_table_without_the_named_columns(tmp_path):
    (tmp_path / "pairs.csv").write_text("path,text\na.png,hello\n")
    with pytest.raises(DataError, match="no column 'filepath'.*--csv-image-key"):
        load_caption_table(tmp_path / "pairs.csv", 8, 1, 0)
    splits_error = pytest.raises(DataError, match="not a file")
    with splits_error:
        load_caption_table(tmp_path / "missing.csv", 8, 1, 0)


def test_all_images_unreadable_is_a_data_error(tmp_path):
    (tmp_path / "pairs.csv").write_text("filepath,title\nnope.png,hello\nalso.png,hi\nnor.png,hey\n")
    with pytest.warns(UserWarning), pytest.raises(DataError, match="none of the 2 held-out images decoded"):
        load_caption_table(tmp_path / "pairs.csv", 8, 2, 0)
