"""Procedurally rendered shapes with captions: the built-in data set, deterministic given a seed, no download.

Each image holds one shape of eight classes (circle, square, triangle, star, cross, ring, crescent, heart) with
a random colour, size, position and rotation, over a random background (a dark, grey or light tone with a
random tint and a shading gradient), plus pixel noise.
The caption names the attributes ("a large red star in the top left on a dark background"), giving about
5,000 distinct captions, so the same source serves SimCLR (the class is the label that kNN evaluation scores)
and CLIP (image-caption pairs whose retrieval is not trivial).

Rendering is vectorised: every shape is an implicit function `inside(x, y)` of coordinates in the shape's own
frame, evaluated on a 2x supersampled grid and average-pooled for anti-aliased edges.
"""
from __future__ import annotations

import math
from itertools import product

import torch
import torch.nn.functional as F

from gradcache.train.data.images.sets import DataSplits, ImageSet
from gradcache.train.errors import UsageError

SMALLEST_IMAGE = 8  # pixels a side: below it a shape is a blur of its noise
SHAPE_NAMES = ["circle", "square", "triangle", "star", "cross", "ring", "crescent", "heart"]

# Named colours (RGB in [0, 1]); each drawn colour is jittered around its name so that names stay true.
COLOURS = {
    "red": (0.85, 0.15, 0.15),
    "green": (0.15, 0.7, 0.2),
    "blue": (0.15, 0.3, 0.9),
    "yellow": (0.95, 0.85, 0.15),
    "purple": (0.6, 0.2, 0.75),
    "orange": (0.95, 0.55, 0.1),
    "white": (0.95, 0.95, 0.95),
    "black": (0.08, 0.08, 0.08),
}
# Background tones: a grey level range, lightly tinted. Backgrounds vary in tone, tint and shading but are never
# saturated: a saturated background colour covers most pixels and is the easiest cue for telling images apart, so
# contrastive training would learn it instead of the shape (feature suppression, Chen et al. 2021).
TONES = [("dark", 0.08, 0.3), ("grey", 0.4, 0.6), ("light", 0.7, 0.92)]
SIZES = [("small", 0.34, 0.44), ("medium", 0.44, 0.56), ("large", 0.56, 0.7)]  # radius bounds, unit = half width
ROWS = ["top", "middle", "bottom"]
COLUMNS = ["left", "center", "right"]
_SUPERSAMPLE = 2


def _inside(shape: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mask of the points of the unit-sized shape `shape`; x, y: (B, S, S) in the shape's frame."""
    radius = torch.sqrt(x * x + y * y)
    angle = torch.atan2(y, x)
    name = SHAPE_NAMES[shape]
    if name == "circle":
        return radius <= 1.0
    if name == "square":
        return torch.maximum(x.abs(), y.abs()) <= 0.8
    if name == "triangle":  # three half-planes, apothem 0.5
        sides = [x * math.cos(a) + y * math.sin(a) for a in (math.pi / 2, math.pi * 7 / 6, math.pi * 11 / 6)]
        return torch.stack(sides).amax(0) <= 0.5
    if name == "star":  # five points: the radius swings between 0.45 and 1.0 with the angle
        return radius <= 0.45 + 0.55 * (0.5 + 0.5 * torch.cos(5 * angle)) ** 3
    if name == "cross":
        return ((x.abs() <= 0.3) & (y.abs() <= 0.95)) | ((y.abs() <= 0.3) & (x.abs() <= 0.95))
    if name == "ring":
        return (radius <= 1.0) & (radius >= 0.6)
    if name == "crescent":
        return (radius <= 1.0) & ((x - 0.45) ** 2 + y * y >= 0.75**2)
    # heart: (x^2 + y^2 - 1)^3 - x^2 y^3 <= 0, scaled and centred into the unit disc
    hx, hy = x * 1.25, -y * 1.25 + 0.15
    return (hx * hx + hy * hy - 1) ** 3 - hx * hx * hy**3 <= 0


def render_shapes(count: int, image_size: int = 32, seed: int = 0, noise: float = 0.06) -> ImageSet:
    """Draw `count` captioned shape images; the same (count, image_size, seed, noise) gives the same bytes."""
    if count < 1 or image_size < SMALLEST_IMAGE:
        raise ValueError(f"need count >= 1 and image_size >= {SMALLEST_IMAGE}, got count={count}, "
                         f"image_size={image_size}")
    generator = torch.Generator().manual_seed(seed)

    def uniform(low: float, high: float, n: int = count) -> torch.Tensor:
        return low + (high - low) * torch.rand(n, generator=generator)

    shapes = torch.randint(len(SHAPE_NAMES), (count,), generator=generator)
    names = list(COLOURS)
    palette = torch.tensor([COLOURS[n] for n in names])  # (C, 3)
    foreground = torch.randint(len(names), (count,), generator=generator)
    # a background tone far enough in RGB from the foreground colour for the shape to stay visible
    mids = torch.tensor([(low + high) / 2 for _, low, high in TONES])  # (T,)
    visible = (palette[:, None, :] - mids[None, :, None]).norm(dim=2) >= 0.35  # (C, T)
    scores = torch.rand(count, len(TONES), generator=generator).masked_fill(~visible[foreground], -1.0)
    background = scores.argmax(1)
    tone_low = torch.tensor([t[1] for t in TONES])[background]
    tone_high = torch.tensor([t[2] for t in TONES])[background]
    level = tone_low + (tone_high - tone_low) * torch.rand(count, generator=generator)
    size_bin = torch.randint(len(SIZES), (count,), generator=generator)
    low = torch.tensor([s[1] for s in SIZES])[size_bin]
    high = torch.tensor([s[2] for s in SIZES])[size_bin]
    radius = low + (high - low) * torch.rand(count, generator=generator)
    # the centre stays far enough from the border that the shape is mostly visible
    centre = (torch.rand(count, 2, generator=generator) * 2 - 1) * (0.95 - radius[:, None] * 0.7)
    rotation = uniform(0.0, 2 * math.pi)

    side = image_size * _SUPERSAMPLE
    axis = (torch.arange(side) + 0.5) / side * 2 - 1
    grid_y, grid_x = torch.meshgrid(axis, axis, indexing="ij")  # (S, S)
    dx = grid_x[None] - centre[:, 0, None, None]  # (B, S, S)
    dy = grid_y[None] - centre[:, 1, None, None]
    cos, sin = torch.cos(rotation)[:, None, None], torch.sin(rotation)[:, None, None]
    local_x = (cos * dx + sin * dy) / radius[:, None, None]
    local_y = (-sin * dx + cos * dy) / radius[:, None, None]
    mask = torch.zeros(count, side, side)
    for shape in range(len(SHAPE_NAMES)):
        rows = (shapes == shape).nonzero().squeeze(1)
        if len(rows):
            mask[rows] = _inside(shape, local_x[rows], local_y[rows]).float()
    mask = F.avg_pool2d(mask[:, None], _SUPERSAMPLE)  # (B, 1, H, W) anti-aliased coverage

    jitter = lambda: (torch.rand(count, 3, generator=generator) - 0.5) * 0.16  # noqa: E731
    fg_rgb = (palette[foreground] + jitter()).clamp(0, 1)[:, :, None, None]  # (B, 3, 1, 1)
    bg_a = (level[:, None] + jitter()).clamp(0, 1)[:, :, None, None]  # grey level with a light tint
    bg_b = (bg_a * uniform(0.8, 0.95)[:, None, None, None]).clamp(0, 1)  # a slightly darker shade
    direction = uniform(0.0, 2 * math.pi)
    axis_small = (torch.arange(image_size) + 0.5) / image_size * 2 - 1
    gy, gx = torch.meshgrid(axis_small, axis_small, indexing="ij")
    ramp = (torch.cos(direction)[:, None, None] * gx + torch.sin(direction)[:, None, None] * gy) * 0.5 + 0.5
    ramp = ramp.clamp(0, 1)[:, None]  # (B, 1, H, W)
    canvas = bg_a * (1 - ramp) + bg_b * ramp
    canvas = canvas * (1 - mask) + fg_rgb * mask
    canvas = canvas + noise * torch.randn(canvas.shape, generator=generator)
    images = (canvas.clamp(0, 1) * 255).round().to(torch.uint8)

    row = ((centre[:, 1] + 1) / 2 * 3).long().clamp(0, 2)
    column = ((centre[:, 0] + 1) / 2 * 3).long().clamp(0, 2)
    captions = [
        _caption(SIZES[s][0], names[f], SHAPE_NAMES[k], ROWS[r], COLUMNS[c], b)
        for s, f, k, r, c, b in zip(
            size_bin.tolist(), foreground.tolist(), shapes.tolist(), row.tolist(), column.tolist(),
            [TONES[b][0] for b in background.tolist()],
        )
    ]
    prompts = [[f"a {size} {colour} {shape}" for size, _, _ in SIZES for colour in names] for shape in SHAPE_NAMES]
    return ImageSet(images=images, labels=shapes, captions=captions, class_names=list(SHAPE_NAMES),
                    class_prompts=prompts)


def _caption(size: str, colour: str, shape: str, row: str, column: str, background: str) -> str:
    if row == "middle" and column == "center":
        place = "in the center"
    elif row == "middle":
        place = f"on the {column}"
    elif column == "center":
        place = f"at the {row}"
    else:
        place = f"in the {row} {column}"
    article = "an" if background[0] in "aeiou" else "a"
    return f"a {size} {colour} {shape} {place} on {article} {background} background"


def caption_words() -> list[str]:
    """Every word a caption of `render_shapes` can hold, sorted: the vocabulary of a tokenizer built for them."""
    sizes, tones = [s[0] for s in SIZES], [t[0] for t in TONES]
    return sorted({word for parts in product(sizes, COLOURS, SHAPE_NAMES, ROWS, COLUMNS, tones)
                   for word in _caption(*parts).split()})


def load_shapes(train_size: int, test_size: int, image_size: int, seed: int) -> DataSplits:
    """Train and held-out shapes drawn from independent streams of the same seed."""
    if image_size < SMALLEST_IMAGE:
        raise UsageError(f"--image-size {image_size} is too small for the built-in shapes, which are drawn at "
                         f"{SMALLEST_IMAGE} pixels or more; pass --image-size {SMALLEST_IMAGE} or larger, or your "
                         "own --data")
    train = render_shapes(train_size, image_size, seed=seed)
    test = render_shapes(test_size, image_size, seed=seed + 1_000_003)
    return DataSplits(train=train, test=test, name="shapes")
