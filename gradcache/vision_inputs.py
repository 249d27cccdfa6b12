"""Vision-language inputs: which rows of a VLM processor's batch own which images, patches and tiles, told from
the data itself, so such a batch splits per example with no `split_fn`.

The layouts (B: the rows, the length of `input_ids` / `attention_mask`):
  - grid-flattened patches (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): `pixel_values` (patches, F) with `image_grid_thw`
    (images, 3), image k owning t*h*w consecutive patch rows; `pixel_values_videos` with `video_grid_thw` alike;
  - per-image axes (LLaVA, Gemma3; LLaVA-NeXT with `image_sizes`): `pixel_values` (images, ...) and every
    per-image key (`image_sizes`, `image_position_ids`) one entry per image, in row order;
  - sample-first tiles (Idefics3, SmolVLM with `pixel_attention_mask`; Mllama with `aspect_ratio_ids` and its
    `cross_attention_mask` (B, L, images, tiles) along the token axis): already one entry per row; a row without
    an image holds only padding tiles;
  - the text side's per-row keys (`mm_token_type_ids`, `token_type_ids`): (B, L), rows like `input_ids`.

Which images belong to which row, in this order of evidence (never a guess):
  1. sentence-transformers' `num_images_per_sample` / `num_videos_per_sample` (B,), where present;
  2. else the image tokens each row holds, against each image's token count: tokens told by
     `mm_token_type_ids` (1 image, 2 video) where the processor emits it, else by the id the encoder's config
     names (`image_token_id` / `image_token_index`, `video_token_id` / `video_token_index`), else by the
     `image_token_id` / `video_token_id` option. A grid image's tokens are its patches over the batch's ratio
     of patches to tokens (the merge, 4 for Qwen's 2x2), and they must fill each row exactly; a per-image
     layout's images each hold the same tokens (LLaVA, Gemma3: a fixed count per image).
A batch whose layout cannot be told apart is refused (ValueError) before any work, naming its keys and the way
out (`num_images_per_sample`, the option, or a `split_fn`). A mapping whose tensors all have B rows and which
holds no image token is plain rows, as any mapping (CLIP's `pixel_values` with `input_ids`).

A chunk whose rows own no image carries no pixel key of that kind (an Idefics3 chunk of text-only rows would
otherwise hold all-padding tiles, which the model cannot reshape).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

ROWS_KEYS = ("input_ids", "attention_mask")  # what tells B
TYPE_IDS = "mm_token_type_ids"  # (B, L): 0 text, 1 image token, 2 video token (transformers' processors)
# (pixels, grid, count, mm type, config attributes naming its token): the grid-flattened kinds
GRID_KINDS = (
    ("pixel_values", "image_grid_thw", "num_images_per_sample", 1, ("image_token_id", "image_token_index")),
    ("pixel_values_videos", "video_grid_thw", "num_videos_per_sample", 2, ("video_token_id", "video_token_index")),
)
PER_IMAGE_KEYS = ("pixel_values", "image_sizes", "image_position_ids")  # one entry per image (LLaVA, Gemma3)
SAMPLE_FIRST_MARKERS = ("pixel_attention_mask", "aspect_ratio_ids")  # a processor that pads images per row
SAMPLE_FIRST_KEYS = ("pixel_values", "pixel_attention_mask", "aspect_ratio_ids", "aspect_ratio_mask")
COUNT_KEYS = ("num_images_per_sample", "num_videos_per_sample")
PER_VIDEO_SECONDS = "second_per_grid_ts"  # Qwen2.5-VL: each video's seconds per temporal patch
# Token-axis keys by role (dim 1): trimming cuts these, and never a vision key that merely has the mask's width.
TOKEN_AXIS_KEYS = frozenset({
    "input_ids", "attention_mask", "token_type_ids", TYPE_IDS, "position_ids", "query_expansion_positions",
    "special_tokens_mask", "labels", "inputs_embeds", "cross_attention_mask", "offset_mapping",
})
VISION_KEYS = frozenset({*PER_IMAGE_KEYS, *SAMPLE_FIRST_KEYS, *COUNT_KEYS, "pixel_values_videos",
                         "image_grid_thw", "video_grid_thw", PER_VIDEO_SECONDS})
POSITIONS_FROM_MASK = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"})  # rope index from the mask


@dataclass(frozen=True)
class VisionHints:
    """What the encoder's config (or an option) says about its inputs: the ids of its image and video tokens,
    and its vision tower's patch side in pixels."""

    image: int | None = None
    video: int | None = None
    patch_size: int | None = None


@dataclass
class VisionLayout:
    """Row r of the batch owns `spans[key][r]` = (start, end) along dim 0 of each item-axis `key`; `groups` are
    the keys a chunk leaves out together when its rows own none of them (a grid's pixels with their grid; a
    sample-first batch's tiles: `tiled` says which rows hold a real one); `patches[r]`: the vision positions
    row r's images hold (their patches), which `chunk_tokens` counts beside its text tokens."""

    rows: int
    spans: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    groups: list[tuple[str, ...]] = field(default_factory=list)
    tiled: list[bool] | None = None
    patches: list[int] | None = None

    def kept_keys(self, value: Mapping[str, Any], index: list[int]) -> set[str]:
        """The keys of `value` a chunk of rows `index` holds: all but the groups none of those rows owns."""
        dropped = set()
        for group in self.groups:
            owned = any(self.spans[group[0]][r][1] > self.spans[group[0]][r][0] for r in index) \
                if group[0] in self.spans else any(self.tiled[r] for r in index)
            if not owned:
                dropped |= {k for k in group if k in value}
        return set(value) - dropped


def has_vision_keys(value: Any) -> bool:
    """Whether an input is a mapping holding a key of a VLM processor's image side."""
    return isinstance(value, Mapping) and any(k in value for k in VISION_KEYS if k not in COUNT_KEYS)


def hints_of(encoder: nn.Module | None, image: int | None = None, video: int | None = None) -> VisionHints:
    """The image and video token ids (the options where given, else the first config among the encoder's
    modules that names them: `image_token_id` or `image_token_index`, a SentenceTransformer's inner model
    included) and the patch side (`vision_config.patch_size`)."""
    found: list[int | None] = [None, None]
    patch_size = None
    for module in encoder.modules() if encoder is not None else ():
        config = getattr(module, "config", None)
        if config is None:
            continue
        found = [f if f is not None else _config_id(config, names) for f, (*_, names) in zip(found, GRID_KINDS)]
        size = getattr(getattr(config, "vision_config", None), "patch_size", None)
        patch_size = patch_size if patch_size is not None else size if isinstance(size, int) else None
        if None not in found and patch_size is not None:
            break
    return VisionHints(image if image is not None else found[0], video if video is not None else found[1], patch_size)


def positions_from_mask(encoder: nn.Module | None) -> bool:
    """Whether the encoder computes positions from the attention mask (Qwen2-VL's rope index), so dropping
    columns that are padding in every row, leading ones included, changes no row's positions."""
    if encoder is None:
        return False
    for module in encoder.modules():
        model_type = getattr(getattr(module, "config", None), "model_type", None)
        if model_type is not None:
            return model_type in POSITIONS_FROM_MASK
    return False


def _config_id(config: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def vision_layout(value: Mapping[str, Any], name: str, hints: VisionHints = VisionHints()) -> VisionLayout | None:
    """The layout of a VLM processor's batch (see the module docstring), or None for a mapping that holds no
    vision key or whose vision keys are plain rows with no image token to say otherwise.

    Raises:
        ValueError: vision keys whose owner rows cannot be told from the data, naming the keys and the way out.
    """
    if not has_vision_keys(value):
        return None
    rows = _rows(value)
    if rows is None:  # pixels alone (a ViT's batch): plain rows
        return None
    layout = VisionLayout(rows)
    if "image_grid_thw" in value or "video_grid_thw" in value:
        for pixels, grid, count, kind, _ in GRID_KINDS:
            if grid in value or pixels in value:
                _grid(value, layout, pixels, grid, count, kind, hints.image if kind == 1 else hints.video, name)
        return layout
    pixel_values = value.get("pixel_values")
    if not isinstance(pixel_values, torch.Tensor):
        return None
    if pixel_values.dim() == 2:  # (patches, F): grid-flattened, and its grid is missing
        raise _refuse(value, name, "pixel_values is grid-flattened (patches, features) with no image_grid_thw")
    if any(k in value for k in SAMPLE_FIRST_MARKERS):
        _sample_first(value, layout, name, hints.patch_size)
        return layout
    return _per_image(value, layout, hints, name)


def _rows(value: Mapping[str, Any]) -> int | None:
    for key in ROWS_KEYS:
        if isinstance(value.get(key), torch.Tensor) and value[key].dim() >= 1:
            return value[key].shape[0]
    return None


def _keys(value: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}: {tuple(v.shape)}" for k, v in value.items() if isinstance(v, torch.Tensor))


def _refuse(value: Mapping[str, Any], name: str, why: str) -> ValueError:
    return ValueError(
        f"cannot tell which rows of {name} own its images ({_keys(value)}): {why}. Pass num_images_per_sample "
        "(B,) in the batch (sentence-transformers' preprocess adds it), or the image_token_id option naming the "
        "image token, or give split_fn=lambda value, chunk_size: [...] to split it yourself."
    )


def _counts_per_row(value: Mapping[str, Any], layout: VisionLayout, count: str, kind: int, token: int | None,
                    name: str) -> tuple[list[int] | None, list[int] | None]:
    """Either the items per row (`count` given) or the image tokens per row (from `mm_token_type_ids` or the
    token id); (None, None) when neither can be read."""
    given = value.get(count)
    if given is not None:
        counts = torch.as_tensor(given).reshape(-1).tolist()
        if len(counts) != layout.rows:
            raise _refuse(value, name, f"{count} has {len(counts)} entries for {layout.rows} rows")
        return counts, None
    if isinstance(value.get(TYPE_IDS), torch.Tensor):
        return None, value[TYPE_IDS].eq(kind).sum(dim=1).tolist()
    if token is not None and isinstance(value.get("input_ids"), torch.Tensor):
        return None, value["input_ids"].eq(token).sum(dim=1).tolist()
    return None, None


def _grid(value, layout: VisionLayout, pixels: str, grid: str, count: str, kind: int, token: int | None,
          name: str) -> None:
    """Spans of grid-flattened patches: row r owns its images' t*h*w patch rows each."""
    if not (isinstance(value.get(grid), torch.Tensor) and isinstance(value.get(pixels), torch.Tensor)):
        raise _refuse(value, name, f"{pixels} and {grid} come together, and one is missing")
    patches = value[grid].prod(dim=1).tolist()  # per image
    if value[pixels].shape[0] != sum(patches):
        raise _refuse(value, name, f"{pixels} has {value[pixels].shape[0]} rows where {grid} makes {sum(patches)}")
    per_row, tokens = _counts_per_row(value, layout, count, kind, token, name)
    if per_row is None:
        if tokens is None:
            raise _refuse(value, name, f"no {count}, no {TYPE_IDS}, and no image token id in the encoder's config")
        per_row = _fill(value, name, tokens, patches, grid)
    if sum(per_row) != len(patches):
        raise _refuse(value, name, f"the rows own {sum(per_row)} images where {grid} holds {len(patches)}")
    starts = [sum(patches[:k]) for k in range(len(patches) + 1)]
    first = [sum(per_row[:r]) for r in range(layout.rows + 1)]
    layout.spans[grid] = [(first[r], first[r + 1]) for r in range(layout.rows)]
    layout.spans[pixels] = [(starts[first[r]], starts[first[r + 1]]) for r in range(layout.rows)]
    group = (pixels, grid)
    per_video = value.get(PER_VIDEO_SECONDS)
    if kind == 2 and per_video is not None and len(per_video) == len(patches):  # Qwen2.5-VL: one per video
        layout.spans[PER_VIDEO_SECONDS] = layout.spans[grid]
        group = (pixels, grid, PER_VIDEO_SECONDS)
    layout.groups.append(group)
    row_patches = [starts[first[r + 1]] - starts[first[r]] for r in range(layout.rows)]
    layout.patches = row_patches if layout.patches is None else [a + b for a, b in zip(layout.patches, row_patches)]


def _fill(value, name: str, tokens: list[int], patches: list[int], grid: str) -> list[int]:
    """Images per row from its image tokens: each image holds patches / merge tokens, merge the batch's ratio of
    patches to tokens, and consecutive images must fill each row's tokens exactly."""
    total = sum(tokens)
    if total == 0 or sum(patches) % total:
        raise _refuse(value, name, f"{sum(patches)} patches in {grid} against {total} image tokens in the rows")
    merge = sum(patches) // total
    per_image = [p // merge for p in patches]
    per_row, k = [], 0
    for want in tokens:
        held, start = 0, k
        while held < want and k < len(per_image):
            held, k = held + per_image[k], k + 1
        if held != want:
            raise _refuse(value, name, f"a row's {want} image tokens are not a whole number of its images' tokens")
        per_row.append(k - start)
    return per_row


def _per_image(value, layout: VisionLayout, hints: VisionHints, name: str) -> VisionLayout | None:
    """Spans of per-image axes: row r owns its images' entries of `pixel_values` and every per-image key."""
    images = value["pixel_values"].shape[0]
    per_row, tokens = _counts_per_row(value, layout, "num_images_per_sample", 1, hints.image, name)
    if per_row is None and (tokens is None or sum(tokens) == 0):
        if images == layout.rows:
            return None  # plain rows: nothing says a row holds other than one image
        raise _refuse(value, name, f"pixel_values has {images} images for {layout.rows} rows, and no {TYPE_IDS} "
                      "or image token id in the encoder's config counts a row's image tokens")
    if per_row is None:
        if "image_sizes" in value:  # LLaVA-NeXT: an image's tokens depend on its size
            raise _refuse(value, name, "each image's token count depends on its image_sizes")
        if sum(tokens) % images or any(t % (sum(tokens) // images) for t in tokens):
            raise _refuse(value, name, f"{sum(tokens)} image tokens are not {images} images of one token count")
        per_row = [t // (sum(tokens) // images) for t in tokens]
    if sum(per_row) != images:
        raise _refuse(value, name, f"the rows own {sum(per_row)} images where pixel_values holds {images}")
    first = [sum(per_row[:r]) for r in range(layout.rows + 1)]
    keys = tuple(k for k in PER_IMAGE_KEYS if isinstance(value.get(k), torch.Tensor) and value[k].shape[0] == images)
    for key in keys:
        layout.spans[key] = [(first[r], first[r + 1]) for r in range(layout.rows)]
    layout.groups.append(keys)
    layout.patches = [n * _tile_patches(value["pixel_values"], hints.patch_size) for n in per_row]
    return layout


def _sample_first(value, layout: VisionLayout, name: str, patch_size: int | None) -> None:
    """Tiles per row: already row-first; a row holds an image when one of its tiles is real."""
    pixel_values = value["pixel_values"]
    if pixel_values.shape[0] != layout.rows:
        raise _refuse(value, name, f"pixel_values has {pixel_values.shape[0]} rows, sample-first tiles need "
                      f"{layout.rows}")
    if isinstance(value.get("pixel_attention_mask"), torch.Tensor):
        real = value["pixel_attention_mask"].flatten(2).ne(0).any(dim=2)  # (B, tiles)
    elif isinstance(value.get("aspect_ratio_mask"), torch.Tensor):
        real = value["aspect_ratio_mask"].flatten(1).ne(0)  # (B, images * tiles)
    else:
        real = pixel_values.flatten(2).ne(0).any(dim=2)  # (B, tiles): a padding tile is all zeros
    tiles = real.sum(dim=1).tolist()
    layout.tiled = [n > 0 for n in tiles]
    layout.groups.append(SAMPLE_FIRST_KEYS)
    layout.patches = [n * _tile_patches(pixel_values, patch_size) for n in tiles]


def _tile_patches(pixels: torch.Tensor, patch_size: int | None) -> int:
    """The patches of one image or tile (..., H, W) of `patch_size` pixels a side; 0 where the size is unknown."""
    if patch_size is None or pixels.dim() < 3:
        return 0
    return (pixels.shape[-2] // patch_size) * (pixels.shape[-1] // patch_size)


def take(value: Mapping[str, Any], layout: VisionLayout, index: list[int],
         per_example: Callable[[Any], bool]) -> dict[str, Any]:
    """Rows `index` (in that order) of a VLM batch: each row's tensors, its images' spans of every item-axis key,
    the per-example lists picked alike; a group none of the rows owns is left out. Consecutive rows in order
    give views (no copy)."""
    contiguous = index == list(range(index[0], index[0] + len(index))) if index else True
    chunk: dict[str, Any] = {}
    for key in layout.kept_keys(value, index):
        entry = value[key]
        if key in layout.spans:
            spans = [layout.spans[key][r] for r in index]
            if contiguous:
                chunk[key] = entry[spans[0][0] : spans[-1][1]]
            elif isinstance(entry, torch.Tensor):
                chunk[key] = torch.cat([entry[s:e] for s, e in spans])
            else:  # a list or tuple of one entry per item (second_per_grid_ts)
                chunk[key] = type(entry)(item for s, e in spans for item in entry[s:e])
        elif isinstance(entry, torch.Tensor) and entry.dim() >= 1 and entry.shape[0] == layout.rows:
            chunk[key] = entry[index[0] : index[0] + len(index)] if contiguous else entry.index_select(
                0, torch.tensor(index, device=entry.device))
        elif not isinstance(entry, torch.Tensor) and per_example(entry):
            picked = [entry[r] for r in index]
            chunk[key] = picked if isinstance(entry, list) else tuple(picked)
        else:
            chunk[key] = entry
    return {key: chunk[key] for key in value if key in chunk}  # the caller's key order
