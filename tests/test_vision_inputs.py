"""A VLM processor's batch splits per example with no split_fn (gradcache/vision_inputs.py): tiny Qwen2-VL
(grid-flattened patches) and Idefics3 (sample-first tiles) with their own processors, rows mixing text only,
image only, image + text and two images + text. GradCache, CachedLoss and NaiveAccumulation against one
full-batch backward (or the per-micro-batch loop over batches the processor made itself), every parameter."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
pytest.importorskip("PIL", reason='the dev extra installs it: pip install -e ".[dev]"')

from gradcache import CachedLoss, Chunks, FullBatch, GradCache, NaiveAccumulation  # noqa: E402
from gradcache.inputs import split, trim_padding  # noqa: E402
from gradcache.losses import InfoNCE  # noqa: E402
from gradcache.vision_inputs import VisionHints, vision_layout  # noqa: E402
from tests.vlm_models import (  # noqa: E402
    IDEFICS_IMAGE, QWEN_IMAGE, VisionLanguageEncoder, idefics3_batch, images, mixed_rows, qwen2_vl_batch,
    tiny_idefics3, tiny_qwen2_vl,
)

ROWS = 4  # one row of each kind: text only, image only, image + text, two images + text
SLOW = pytest.mark.slow  # a sweep over chunk sizes: seconds on a loaded 2-core machine


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def qwen():
    model, processor = tiny_qwen2_vl(seed=0)
    return VisionLanguageEncoder(model), processor


@pytest.fixture(scope="module")
def idefics():
    model, processor = tiny_idefics3(seed=0)
    return VisionLanguageEncoder(model), processor


def batches(family, processor):
    make = qwen2_vl_batch if family == "qwen" else idefics3_batch
    return make(processor, ROWS, seed=0), make(processor, ROWS, seed=2)


def gradients(encoder) -> dict[str, torch.Tensor | None]:
    return {name: None if p.grad is None else p.grad.clone() for name, p in encoder.named_parameters()}


def assert_close(got: dict, want: dict, rel: float = 1e-5) -> None:
    """Every parameter's gradient within `rel` of its own largest entry, or of the model's largest for a
    gradient that is zero but for rounding (a key bias under softmax); None where the reference is None."""
    assert got.keys() == want.keys()
    overall = max(w.abs().max().item() for w in want.values() if w is not None)
    assert overall > 0
    for name, w in want.items():
        if w is None:
            assert got[name] is None or not got[name].any(), name
            continue
        assert got[name] is not None, name
        error, scale = (got[name] - w).abs().max().item(), max(w.abs().max().item(), 1e-4 * overall)
        assert error <= rel * scale, f"{name}: max error {error:.3g} vs scale {scale:.3g}"


def run(strategy_class, encoder, inputs, chunk_size=None, **options):
    encoder.zero_grad(set_to_none=True)
    loss = strategy_class(encoder, InfoNCE(temperature=0.1), chunk_size, **options).step(*inputs)
    return loss, gradients(encoder)


def reference(encoder, inputs):
    return run(FullBatch, encoder, inputs)


@pytest.mark.parametrize("family", ["qwen", "idefics"])
@pytest.mark.parametrize("options", [pytest.param({"chunk_size": 1}, marks=SLOW), {"chunk_size": 2},
                                     pytest.param({"chunk_size": 3}, marks=SLOW),
                                     pytest.param({"chunk_size": 2, "trim_padding": True}, marks=SLOW),
                                     {"chunk_size": 4, "chunk_tokens": 60}],
                         ids=["chunk1", "chunk2", "chunk3", "chunk2-trim", "tokens"])
def test_gradcache_equals_one_full_batch_backward_with_no_split_fn(family, options, request):
    encoder, processor = request.getfixturevalue(family)
    inputs = batches(family, processor)
    want_loss, want = reference(encoder, inputs)
    options = dict(options)
    got_loss, got = run(GradCache, encoder, inputs, options.pop("chunk_size"), **options)
    assert torch.allclose(got_loss, want_loss, rtol=1e-5)
    assert_close(got, want)


@pytest.mark.parametrize("family", ["qwen", "idefics"])
def test_cached_loss_and_memory_budget_equal_the_full_batch(family, request):
    encoder, processor = request.getfixturevalue(family)
    inputs = batches(family, processor)
    want_loss, want = reference(encoder, inputs)
    encoder.zero_grad(set_to_none=True)
    loss = CachedLoss(encoder, InfoNCE(temperature=0.1), 2, trim_padding=True)(*inputs)
    loss.backward()
    assert torch.allclose(loss.detach(), want_loss, rtol=1e-5)
    assert_close(gradients(encoder), want)
    calls = []
    hook = encoder.register_forward_pre_hook(lambda *_: calls.append(1))
    try:  # 4 chunks: some kept with their graphs (encoded once), some re-encoded
        _, got = run(GradCache, encoder, inputs, 2, memory_budget=800_000 if family == "qwen" else 1_600_000)
    finally:
        hook.remove()
    assert 4 < len(calls) < 8
    assert_close(got, want)


@pytest.mark.parametrize("family", ["qwen", "idefics"])
def test_naive_accumulation_equals_the_loop_over_micro_batches_the_processor_made(family, request):
    """Micro-batch k of the library's split is what the processor gives for those rows alone."""
    encoder, processor = request.getfixturevalue(family)
    marker, make = (QWEN_IMAGE, qwen2_vl_batch) if family == "qwen" else (IDEFICS_IMAGE, idefics3_batch)
    got_loss, got = run(NaiveAccumulation, encoder, batches(family, processor), 2)
    encoder.zero_grad(set_to_none=True)
    rows = [mixed_rows(ROWS, marker, seed) for seed in (0, 2)]
    losses = []
    for start in range(0, ROWS, 2):  # 2 micro-batches
        pieces = [_processed(processor, family, texts[start : start + 2], row_images[start : start + 2])
                  for texts, row_images in rows]
        loss = InfoNCE(temperature=0.1)(*(encoder(**piece) for piece in pieces))
        (loss / 2).backward()
        losses.append(loss.detach())
    assert torch.allclose(got_loss, torch.stack(losses).mean(), rtol=1e-5)
    assert_close(got, gradients(encoder))


def _processed(processor, family, texts, row_images):
    if family == "qwen":
        flat = [image for row in row_images for image in row]
        return dict(processor(text=texts, images=flat or None, padding=True, return_tensors="pt"))
    return dict(processor(text=texts, images=row_images if any(row_images) else None, padding=True,
                          return_tensors="pt"))


@pytest.mark.parametrize("family", ["qwen", "idefics"])
def test_each_chunk_holds_its_rows_images_and_a_text_only_chunk_no_pixels(family, request):
    encoder, processor = request.getfixturevalue(family)
    batch = batches(family, processor)[0]
    hints = VisionHints(image=encoder.model.config.image_token_id)
    chunks = split(batch, 1, hints=hints)
    assert len(chunks) == ROWS
    whole = encoder(**batch)
    for row, chunk in enumerate(chunks):
        assert torch.allclose(encoder(**chunk), whole[row : row + 1], atol=1e-5)
        if not chunk["attention_mask"].mul(chunk["input_ids"].eq(hints.image)).any():  # text only
            assert "pixel_values" not in chunk and "image_grid_thw" not in chunk and "pixel_attention_mask" not in chunk


def test_grid_rows_told_by_the_config_token_or_the_option_without_mm_token_type_ids(qwen):
    encoder, processor = qwen
    batch = batches("qwen", processor)[0]
    plain = {k: v for k, v in batch.items() if k != "mm_token_type_ids"}
    told = vision_layout(batch, "input 0")  # mm_token_type_ids
    assert vision_layout(plain, "input 0", VisionHints(image=encoder.model.config.image_token_id)).spans == told.spans
    with pytest.raises(ValueError, match=r"input 0 .*pixel_values: \(\d+, 1176\).*image_grid_thw.*split_fn"):
        GradCache(torch.nn.Sequential(), InfoNCE(), 2).step(plain, plain)  # no config to read: refused by name
    want = split(batch, 2)
    got = split(plain, 2, hints=VisionHints(image=encoder.model.config.image_token_id))
    for w, g in zip(want, got):
        assert [k for k in w if k != "mm_token_type_ids"] == list(g)
        assert all(torch.equal(w[k], g[k]) for k in g)
    # the option names it for an encoder whose config does not
    bare = torch.nn.Linear(2, 2)
    id_ = encoder.model.config.image_token_id
    cache = GradCache(bare, InfoNCE(), 2, image_token_id=id_)
    assert cache.check_inputs((plain, plain)) == [ROWS, ROWS]


def test_a_grid_batch_as_many_images_as_rows_is_not_taken_for_one_image_per_row(qwen):
    """sentence-transformers' guess (grid rows == batch size: one image per row) splits this batch wrongly."""
    encoder, processor = qwen
    texts = ["a cat", f"{QWEN_IMAGE} {QWEN_IMAGE} red", f"{QWEN_IMAGE} blue"]
    batch = dict(processor(text=texts, images=images(3), padding=True, return_tensors="pt"))
    assert batch["image_grid_thw"].shape[0] == 3
    layout = vision_layout(batch, "input 0")
    assert layout.spans["image_grid_thw"] == [(0, 0), (0, 2), (2, 3)]
    chunks = split(batch, 1)
    assert "pixel_values" not in chunks[0] and chunks[1]["image_grid_thw"].shape[0] == 2


@pytest.mark.parametrize("bad, message", [
    (lambda b: {**b, "num_images_per_sample": torch.tensor([1, 1])}, "num_images_per_sample has 2 entries"),
    (lambda b: {**b, "pixel_values": b["pixel_values"][:-4]}, "pixel_values has"),
    (lambda b: {k: v for k, v in b.items() if k != "image_grid_thw"}, "no image_grid_thw"),
], ids=["counts", "patches", "grid"])
def test_a_layout_that_cannot_be_told_apart_is_refused_before_any_work(qwen, bad, message):
    encoder, processor = qwen
    batch = bad(batches("qwen", processor)[0])
    encoder.zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match=message + r".*split_fn"):
        GradCache(encoder, InfoNCE(), 2).step(batch, batch)
    assert all(p.grad is None for p in encoder.parameters())


def test_per_image_axes_split_by_image_tokens_and_by_num_images_per_sample():
    """LLaVA/Gemma3's layout (pixel_values (images, C, H, W)), without a model: spans from the counts."""
    ids = torch.tensor([[5, 9, 9, 6], [9, 9, 9, 9], [5, 6, 0, 0]])
    batch = {"input_ids": ids, "attention_mask": ids.ne(0).long(), "pixel_values": torch.randn(3, 3, 4, 4)}
    layout = vision_layout(batch, "input 0", VisionHints(image=9))
    assert layout.spans["pixel_values"] == [(0, 1), (1, 3), (3, 3)]
    chunks = split(batch, 1, hints=VisionHints(image=9))
    assert torch.equal(chunks[1]["pixel_values"], batch["pixel_values"][1:3]) and "pixel_values" not in chunks[2]
    counted = vision_layout({**batch, "num_images_per_sample": torch.tensor([1, 2, 0])}, "input 0")
    assert counted.spans == layout.spans
    with pytest.raises(ValueError, match="image_sizes"):  # LLaVA-NeXT: tokens per image vary with its size
        vision_layout({**batch, "image_sizes": torch.ones(3, 2)}, "input 0", VisionHints(image=9))
    plain = {"input_ids": ids, "attention_mask": ids.ne(0).long(), "pixel_values": torch.randn(3, 3, 4, 4)}
    assert vision_layout(plain, "input 0") is None  # CLIP's rows: as many images as rows, no image token


def test_trimming_cuts_token_axis_keys_by_role_never_tiles_as_wide_as_the_mask():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    chunk = {"input_ids": mask * 4, "attention_mask": mask, "mm_token_type_ids": mask * 0,
             "pixel_values": torch.randn(2, 3, 3, 8, 8), "pixel_attention_mask": torch.ones(2, 3, 8, 8),
             "cross_attention_mask": torch.ones(2, 3, 1, 4)}
    trimmed = trim_padding(chunk)
    assert trimmed["input_ids"].shape == trimmed["mm_token_type_ids"].shape == (2, 2)
    assert trimmed["cross_attention_mask"].shape == (2, 2, 1, 4)  # Mllama's: along the token axis
    assert trimmed["pixel_values"].shape == (2, 3, 3, 8, 8) and trimmed["pixel_attention_mask"].shape[1] == 3


@pytest.mark.parametrize("family", ["qwen", "idefics"])
def test_left_padding_is_measured_by_the_mask_and_trimmed_where_positions_come_from_it(family):
    """Qwen2-VL takes positions from the mask: leading padding is dropped exactly, and chunk_tokens sorts by the
    mask. Idefics3's Llama counts positions from column 0: its left-padded chunks keep their width, exactly."""
    build, make = (tiny_qwen2_vl, qwen2_vl_batch) if family == "qwen" else (tiny_idefics3, idefics3_batch)
    model, processor = build(seed=1, padding_side="left")
    encoder = VisionLanguageEncoder(model)
    inputs = make(processor, ROWS, seed=0), make(processor, ROWS, seed=2)
    assert inputs[0]["attention_mask"][:, 0].eq(0).any()  # left-padded
    want_loss, want = reference(encoder, inputs)
    widths = []
    hook = encoder.register_forward_pre_hook(lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape[1]),
                                             with_kwargs=True)
    try:
        got_loss, got = run(GradCache, encoder, inputs, 4, chunk_tokens=60)
    finally:
        hook.remove()
    assert torch.allclose(got_loss, want_loss, rtol=1e-5)
    assert_close(got, want)
    full = {value["attention_mask"].shape[1] for value in inputs}
    if family == "qwen":
        assert min(widths) < min(full)  # leading padding dropped
    else:
        assert set(widths) <= full  # positions from column 0: nothing leading dropped


def test_ready_made_chunks_and_full_batch_drop_pixels_of_text_only_idefics3_chunks(idefics):
    encoder, processor = idefics
    inputs = batches("idefics", processor)
    want_loss, want = reference(encoder, inputs)
    chunks = [Chunks(split(value, 2)) for value in inputs]
    padded = [Chunks([{**c, **{k: torch.zeros_like(inputs[i][k][:len(c["input_ids"])])
                                         for k in ("pixel_values", "pixel_attention_mask")}}
                      if "pixel_values" not in c else c for c in chunked])
              for i, chunked in enumerate(chunks)]  # as a loader would give them: all-padding tiles included
    for strategy_class in (GradCache, FullBatch):
        got_loss, got = run(strategy_class, encoder, padded, 2)
        assert torch.allclose(got_loss, want_loss, rtol=1e-5)
        assert_close(got, want)


def test_videos_split_by_their_grid_with_their_seconds_and_pixels_alone_are_rows():
    """Qwen2.5-VL's videos: `pixel_values_videos` by `video_grid_thw`, `second_per_grid_ts` one per video."""
    types = torch.tensor([[0, 2, 2, 0], [0, 0, 0, 0], [2, 2, 2, 2]])  # video tokens 2, 0, 4: 8, 0, 16 patches
    batch = {"input_ids": types + 5, "attention_mask": torch.ones(3, 4), "mm_token_type_ids": types,
             "pixel_values_videos": torch.arange(24.0).unsqueeze(1),
             "video_grid_thw": torch.tensor([[2, 2, 2], [1, 4, 4]]), "second_per_grid_ts": [0.5, 1.0]}
    chunks = split(batch, 1)
    assert [c["pixel_values_videos"].shape[0] if "pixel_values_videos" in c else 0 for c in chunks] == [8, 0, 16]
    assert chunks[0]["second_per_grid_ts"] == [0.5] and chunks[2]["second_per_grid_ts"] == [1.0]
    assert "second_per_grid_ts" not in chunks[1] and "video_grid_thw" not in chunks[1]
    assert torch.equal(chunks[2]["pixel_values_videos"], batch["pixel_values_videos"][8:])
    assert vision_layout({"pixel_values": torch.randn(3, 3, 4, 4)}, "input 0") is None  # a ViT's batch: rows
    assert len(split({"pixel_values": torch.randn(3, 3, 4, 4)}, 2)) == 2


def test_chunk_tokens_counts_each_rows_vision_patches_beside_its_tokens():
    """Four rows of 4 tokens; rows 0 and 1 hold an image of 16 patches each. At 39 tokens the two image rows
    cannot share a chunk (2 x 4 + 32 = 40); the second takes both text-only rows (3 x 4 + 16 = 28)."""
    from gradcache.token_chunks import token_plan

    types = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]])
    batch = {"input_ids": types + 5, "attention_mask": torch.ones(4, 4, dtype=torch.long), "mm_token_type_ids": types,
             "pixel_values": torch.randn(32, 6), "image_grid_thw": torch.tensor([[1, 4, 4], [1, 4, 4]])}
    layout = vision_layout(batch, "input 0")
    assert layout.patches == [16, 16, 0, 0]
    order, sizes = token_plan(batch, 39, 8, layout)
    assert order.tolist() == [0, 1, 2, 3] and sizes == [1, 3]
    assert token_plan(batch, 39, 8)[1] == [4]  # tokens alone: 4 rows x 4 fit
