import math

import pytest
import torch

from gradcache.train.optim.schedule import WarmupCosine, warmup_cosine


def test_warmup_then_cosine_against_the_formula():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=2.0)
    scheduler = warmup_cosine(optimizer, warmup_steps=4, total_steps=14)
    seen = []
    for _ in range(14):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    expected = [2.0 * (s + 1) / 4 for s in range(4)]
    expected += [2.0 * 0.5 * (1 + math.cos(math.pi * (s - 4) / 10)) for s in range(4, 14)]
    assert seen == pytest.approx(expected)


def test_schedule_state_round_trips():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    scheduler = warmup_cosine(optimizer, 2, 10)
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    other_optimizer = torch.optim.SGD([parameter], lr=1.0)
    other = warmup_cosine(other_optimizer, 2, 10)
    other.load_state_dict(scheduler.state_dict())
    assert other.get_last_lr() == scheduler.get_last_lr()


def test_bad_schedule_arguments():
    with pytest.raises(ValueError, match="--warmup 11"):
        WarmupCosine(11, 10)
    with pytest.raises(ValueError, match="total steps"):
        WarmupCosine(0, 0)
