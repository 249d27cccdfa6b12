"""SimCLR's augmentations through torchvision transforms, sized for small images, and the plain eval transform.

The pipeline is SimCLR's (Chen et al. 2020, appendix A): random resized crop, horizontal flip, colour jitter
(p = 0.8), greyscale (p = 0.2), Gaussian blur (p = 0.5), with the blur kernel scaled to ~10% of the image side
(at least 3) so that 32 x 32 images are not smeared flat. Transforms work on one (3, H, W) uint8 image and
return it as float, normalised to [-1, 1].
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torchvision.transforms import v2

MEAN = (0.5, 0.5, 0.5)
STD = (0.5, 0.5, 0.5)


def to_model_input(images: torch.Tensor) -> torch.Tensor:
    """uint8 (..., 3, H, W) -> float32 normalised to [-1, 1], the input every encoder sees."""
    return (images.float() / 255.0 - 0.5) / 0.5


def rotate_reflected(image: torch.Tensor, degrees: float) -> torch.Tensor:
    """(C, H, W) float image rotated by `degrees` about its centre (counter-clockwise as displayed, as in torchvision),
    bilinear, with the corners the rotation uncovers filled by reflecting the image at its border."""
    angle = math.radians(degrees)
    cos, sin = math.cos(angle), math.sin(angle)
    # affine_grid maps each output pixel to the input point it samples (x right, y down, in [-1, 1])
    theta = torch.tensor([[[cos, -sin, 0.0], [sin, cos, 0.0]]], dtype=image.dtype)
    grid = F.affine_grid(theta, [1, *image.shape], align_corners=False)
    return F.grid_sample(image[None], grid, mode="bilinear", padding_mode="reflection", align_corners=False)[0]


class RandomReflectedRotation(torch.nn.Module):
    """Rotate by an angle drawn uniformly from [-degrees, degrees] with `rotate_reflected`: no constant-colour
    corner marks a rotated view, as torchvision's RandomRotation (constant fill) would."""

    def __init__(self, degrees: float) -> None:
        super().__init__()
        if not 0 <= degrees <= 180:
            raise ValueError(f"degrees must be in [0, 180], got {degrees}")
        self.degrees = degrees

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return rotate_reflected(image, self.degrees * (2 * torch.rand(()).item() - 1))


def simclr_augmentation(
    image_size: int,
    crop_scale: tuple[float, float] = (0.25, 1.0),
    jitter_strength: float = 0.5,
    blur_probability: float = 0.5,
    channel_permutation: float = 0.0,
    rotation: float = 0.0,
) -> v2.Compose:
    """One random view of a (3, H, W) uint8 image: crop, flip, jitter, greyscale, blur, then normalise.

    Args:
        image_size: output side in pixels.
        crop_scale: area fraction range of the random resized crop (SimCLR: 0.08-1 at 224 px; small images
            keep more, or a small shape can be cropped out entirely).
        jitter_strength: SimCLR's s: brightness, contrast, saturation 0.8 s and hue 0.2 s.
        blur_probability: chance of a Gaussian blur with sigma in [0.1, 2.0].
        channel_permutation: chance of a random permutation of the RGB channels after the jitter. Hue jitter
            shifts every colour of an image alike, so the relation of foreground to background colour survives it
            and becomes the easiest cue for telling images apart; permuting channels breaks that relation.
        rotation: largest rotation in degrees (0: none; SimCLR has none). For data whose classes do not change
            under rotation, such as the built-in shapes drawn at any angle, it removes orientation as a cue.
    """
    if not 0 < crop_scale[0] <= crop_scale[1] <= 1:
        raise ValueError(f"crop_scale must satisfy 0 < low <= high <= 1, got {crop_scale}")
    if not 0 <= jitter_strength <= 2.5:
        raise ValueError(f"jitter_strength must be in [0, 2.5] (hue shift 0.2 s at most 0.5), got {jitter_strength}")
    blur_kernel = max(3, int(0.1 * image_size) // 2 * 2 + 1)  # odd, ~10% of the side
    strength = 0.8 * jitter_strength
    return v2.Compose([
        v2.ToDtype(torch.float32, scale=True),  # float first: colour ops on float skip uint8 round trips
        *([RandomReflectedRotation(rotation)] if rotation > 0 else []),
        v2.RandomResizedCrop(image_size, scale=crop_scale, antialias=True),
        v2.RandomHorizontalFlip(),
        v2.RandomApply([v2.ColorJitter(strength, strength, strength, 0.2 * jitter_strength)], p=0.8),
        v2.RandomApply([v2.RandomChannelPermutation()], p=channel_permutation),
        v2.RandomGrayscale(p=0.2),
        v2.RandomApply([v2.GaussianBlur(blur_kernel, sigma=(0.1, 2.0))], p=blur_probability),
        v2.Normalize(MEAN, STD),
    ])
