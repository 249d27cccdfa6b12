import pytest
import torch

from gradcache.train.data.images.augment import (
    RandomReflectedRotation,
    rotate_reflected,
    simclr_augmentation,
)


def test_quarter_turn_is_rot90():
    image = torch.rand(3, 8, 8, dtype=torch.float64)
    # counter-clockwise as displayed (row 0 at the top) is torch.rot90 over (H, W) with k=1
    torch.testing.assert_close(rotate_reflected(image, 90.0), torch.rot90(image, 1, dims=(1, 2)))
    torch.testing.assert_close(rotate_reflected(image, -90.0), torch.rot90(image, -1, dims=(1, 2)))
    torch.testing.assert_close(rotate_reflected(image, 0.0), image)


def test_uncovered_corners_are_reflected_not_filled():
    image = torch.full((3, 16, 16), 0.7)
    rotated = rotate_reflected(image, 45.0)
    torch.testing.assert_close(rotated, image)  # a constant fill (0) would darken the corners


def test_random_rotation_draws_from_the_global_generator():
    image = torch.rand(3, 16, 16)
    rotate = RandomReflectedRotation(180.0)
    torch.manual_seed(3)
    first = rotate(image)
    torch.manual_seed(3)
    torch.testing.assert_close(rotate(image), first)
    assert not torch.allclose(rotate(image), first)


@pytest.mark.parametrize("degrees", [-1.0, 181.0])
def test_rotation_outside_the_range_is_refused(degrees):
    with pytest.raises(ValueError, match="degrees"):
        RandomReflectedRotation(degrees)


def test_augmentation_with_rotation_keeps_shape_and_range():
    views = simclr_augmentation(16, rotation=180.0)(torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8))
    assert views.shape == (3, 16, 16) and views.dtype == torch.float32
    assert views.min() >= -1.0 - 1e-6 and views.max() <= 1.0 + 1e-6
