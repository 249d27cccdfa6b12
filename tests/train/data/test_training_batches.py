import torch

from gradcache.train.data.images.augment import simclr_augmentation
from gradcache.train.data.images.shapes import render_shapes
from gradcache.train.data.images.training_batches import AugmentedPairs, training_batches
from gradcache.train.data.order import StepSampler


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
    assert batch_images.dtype == torch.uint8 and torch.equal(batch_images, images.images[indices])  # bytes cross
