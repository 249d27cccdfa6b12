"""Small encoders and helpers shared by the core tests."""
from __future__ import annotations

import pytest
import torch
from torch import nn


class TokenEncoder(nn.Module):
    """A tiny text tower that ignores masked positions: embedding, masked mean pooling, projection."""

    def __init__(self, vocab: int = 50, width: int = 12, out: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.Linear(width, width)
        self.dropout = nn.Dropout(0.2)
        self.proj = nn.Linear(width, out)
        self.seen_lengths: list[int] = []

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        self.seen_lengths.append(input_ids.shape[1])
        hidden = self.dropout(torch.tanh(self.mix(self.embed(input_ids))))  # (B, L, W)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1)  # (B, W)
        return self.proj(pooled)


def mlp(inp: int = 10, hidden: int = 16, out: int = 6, dropout: float = 0.0) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inp, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, out))


def grads_of(*modules: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for m_index, module in enumerate(modules):
        for name, p in module.named_parameters():
            out[f"{m_index}.{name}"] = None if p.grad is None else p.grad.detach().clone()
    return out


def zero(*modules: nn.Module) -> None:
    for module in modules:
        module.zero_grad(set_to_none=True)


def assert_grads_close(got: dict, want: dict, rel: float) -> None:
    """Every parameter's gradient within `rel` of the largest gradient entry."""
    assert got.keys() == want.keys()
    scale = max(w.abs().max().item() for w in want.values() if w is not None)
    assert scale > 0
    for name in want:
        assert got[name] is not None and want[name] is not None, name
        error = (got[name] - want[name]).abs().max().item()
        assert error <= rel * scale, f"{name}: max error {error:.3g} vs scale {scale:.3g}"


def tokens(n: int, length: int = 9, vocab: int = 50, seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded token ids with random lengths (at least 1)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n, length), generator=g)
    lengths = torch.randint(1, length + 1, (n,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    return {"input_ids": ids * mask, "attention_mask": mask}


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory):
    """A 2-layer BERT and its tokenizer written once for the session (tests.tiny_text_model): no download."""
    pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
    from tests.tiny_text_model import write_tiny_bert

    return write_tiny_bert(tmp_path_factory.mktemp("models") / "bert")


@pytest.fixture
def seeded() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a module's tests (`pytestmark = pytest.mark.usefixtures("one_thread")`): tiny models
    such as the width-32 VLMs gain nothing from a second thread, and on a busy 2-core machine lose seconds to it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_strategy(strategy: type, modules: tuple[nn.Module, ...], encoders, loss, inputs, chunk_size):
    """One step of `strategy` (CachedLoss through its backward) from zeroed gradients: (detached loss, grads)."""
    from gradcache import CachedLoss, FullBatch

    zero(*modules)
    if strategy is CachedLoss:
        value = CachedLoss(encoders, loss, chunk_size)(*inputs)
        value.backward()
    elif strategy is FullBatch:
        value = FullBatch(encoders, loss).step(*inputs)
    else:
        value = strategy(encoders, loss, chunk_size).step(*inputs)
    return value.detach(), grads_of(*modules)

