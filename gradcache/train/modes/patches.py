"""A ViT's patches tile its images: the one check of `--image-size` against a patch size, for the built-in ViT
presets and open_clip's vision transformers alike.

A size the patches do not tile is not an error for the model itself: its strided patch convolution drops the
right and bottom remainder, so a 60 px image on 32 px patches trains on its top-left 32 px only.
"""
from __future__ import annotations

from gradcache.train.errors import UsageError


def check_patches_tile(model: str, image_size: int, patch_size: int) -> None:
    """UsageError naming `--image-size`, the patch size and the nearest sizes it tiles, unless `patch_size`
    divides `image_size`."""
    if image_size % patch_size == 0:
        return
    below, above = image_size // patch_size * patch_size, (image_size // patch_size + 1) * patch_size
    nearest = f"{below} or {above}" if below > 0 else str(above)
    raise UsageError(f"--model {model} needs --image-size divisible by its patch size {patch_size}, got "
                     f"--image-size {image_size}: its patches would cover only the top-left {below} px of each "
                     f"image; use --image-size {nearest}")
