import torch

from gradcache.train.data.order import StepSampler, epoch_order


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
