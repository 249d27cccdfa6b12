import torch

from gradcache.train.data.images.shapes import (
    COLOURS,
    SHAPE_NAMES,
    TONES,
    caption_words,
    load_shapes,
    render_shapes,
)


def test_same_seed_same_bytes_and_captions():
    first, second = render_shapes(40, 16, seed=3), render_shapes(40, 16, seed=3)
    assert torch.equal(first.images, second.images)
    assert torch.equal(first.labels, second.labels)
    assert first.captions == second.captions


def test_caption_words_are_the_words_the_captions_hold():
    """Each word of 400 drawn captions is in it, and each of its words is drawn (every size, colour, shape,
    place and tone appears among 400)."""
    drawn = {word for caption in render_shapes(400, 8, seed=5).captions for word in caption.split()}
    assert set(caption_words()) == drawn and caption_words() == sorted(drawn)


def test_different_seed_different_images():
    assert not torch.equal(render_shapes(40, 16, seed=3).images, render_shapes(40, 16, seed=4).images)


def test_caption_names_the_class_and_a_colour():
    shapes = render_shapes(200, 16, seed=0)
    for label, caption in zip(shapes.labels.tolist(), shapes.captions):
        words = caption.split()
        assert SHAPE_NAMES[label] == words[3]
        assert words[2] in COLOURS and words[-2] in {name for name, _, _ in TONES}


def test_not_trivial_every_class_and_many_distinct_captions():
    shapes = render_shapes(600, 16, seed=1)
    assert set(shapes.labels.tolist()) == set(range(len(SHAPE_NAMES)))
    assert len(set(shapes.captions)) > 350
    # the images vary in colour, not just in shape: the per-image mean colour is spread out
    assert shapes.images.float().mean((2, 3)).std(0).min() > 20


def test_train_and_test_splits_are_independent_draws():
    splits = load_shapes(32, 16, 16, seed=0)
    assert len(splits.train) == 32 and len(splits.test) == 16
    assert not torch.equal(splits.train.images[:16], splits.test.images)
