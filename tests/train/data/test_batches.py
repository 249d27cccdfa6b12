import torch

from gradcache.train.data.images.augment import simclr_augmentation
from gradcache.train.data.images.shapes import render_shapes
from gradcache.train.data.order import (
    AugmentedPairs,
    StepSampler,
    epoch_order,
    training_batches,
)


def test_epoch_order_is_a_function_of_seed_and_epoch():
    assert torch.equal(epoch_order(50, 1, 2), epoch_order(50, 1, 2))
    assert not torch.equal(epoch_order(50, 1, 2), epoch_order(50, 1, 3))
    assert sorted(epoch_order(50, 1, 2).tolist()) == list(range(50))


def test_steps_walk_the_epoch_orders_and_drop_the_partial_batch():
    sampler = StepSampler(count=10, batch_size=4, seed=0, start_step=0, total_steps=5)
    batches = list(sampler)
    assert [b[0][0] for b in batches] == [0, 0, 1, 1, 2]  # 2 full batches per epoch of 10
    assert [i for _, i in batches[0] + batches[1]] == epoch_order(10, 0, 0)[:8].tolist()
    resumed = list(StepSampler(10, 4, 0, start_step=3, total_steps=5))
    assert resumed == batches[3:]


def test_rank_slices_concatenate_to_the_global_batch():
    whole = list(StepSampler(12, 6, 0, 0, 3))
    slices = [list(StepSampler(12, 6, 0, 0, 3, rank=r, world_size=3)) for r in range(3)]
    for step in range(3):
        assert slices[0][step] + slices[1][step] + slices[2][step] == whole[step]


def test_views_do_not_depend_on_the_global_random_state():
    images = render_shapes(8, 16, seed=0)
    pairs = AugmentedPairs(images, seed=0, augmentation=simclr_augmentation(16), captions=False)
    torch.manual_seed(1)
    first = pairs[(0, 3)]
    torch.manual_seed(2)
    second = pairs[(0, 3)]
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert not torch.equal(first[0], first[1])  # two different views
    assert not torch.equal(pairs[(1, 3)][0], first[0])  # another epoch, other views
    state = torch.get_rng_state()
    pairs[(0, 4)]
    assert torch.equal(state, torch.get_rng_state())


def test_loader_gives_view_pairs_and_caption_tokens():
    images = render_shapes(16, 16, seed=0)
    sampler = StepSampler(16, 4, 0, 0, 2)
    views = list(training_batches(images, sampler, simclr_augmentation(16), None, workers=0))
    assert len(views) == 2 and views[0][0].shape == (4, 3, 16, 16) and views[0][0].dtype == torch.float32

    def tokenizer(texts):
        return {"input_ids": torch.tensor([[len(t)] for t in texts])}

    batch_images, tokens = next(iter(training_batches(images, sampler, None, tokenizer, workers=0)))
    indices = [i for _, i in next(iter(sampler))]
    assert tokens["input_ids"][:, 0].tolist() == [len(images.captions[i]) for i in indices]
    assert torch.allclose(batch_images, (images.images[indices].float() / 255 - 0.5) / 0.5)
