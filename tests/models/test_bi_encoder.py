import pytest
import torch
from torch import nn

from gradcache.models.bi_encoder import BiEncoder


class _Tower(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(scale))
        self.out_dim = 3
        self.checkpointing = False

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        self.checkpointing = enabled

    def forward(self, input_ids, attention_mask=None):
        return input_ids.float() * self.weight


def test_shared_tower_embeds_both_sides_and_holds_its_parameters_once():
    tower = _Tower(2.0)
    model = BiEncoder(tower)
    ids = torch.ones(2, 3, dtype=torch.long)
    assert model.shared and model.query_tower is model.passage_tower is tower
    torch.testing.assert_close(model.encode_query(input_ids=ids), model.encode_passage(input_ids=ids))
    assert len(list(model.parameters())) == 1 and list(model.state_dict()) == ["towers.0.weight"]
    assert model.out_dim == 3


def test_separate_towers_and_grad_checkpointing():
    model = BiEncoder(_Tower(2.0), _Tower(3.0))
    ids = torch.ones(1, 3, dtype=torch.long)
    assert not model.shared
    assert model.encode_query(input_ids=ids).sum() == 6 and model.encode_passage(input_ids=ids).sum() == 9
    model.set_grad_checkpointing(True)
    assert model.query_tower.checkpointing and model.passage_tower.checkpointing


def test_the_same_module_twice_is_refused():
    tower = _Tower(1.0)
    with pytest.raises(ValueError, match="passage_tower=None"):
        BiEncoder(tower, tower)
