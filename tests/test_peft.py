"""A LoRA model that the user wraps with peft (`get_peft_model`) trains through GradCache and CachedLoss like any
module: every LoRA parameter gets the full batch's gradient, LoRA dropout on (replayed in phase 3), with
trim_padding, chunk_tokens and non-reentrant gradient checkpointing; the frozen base weights get no gradient.

The models are a tiny BERT and a tiny Llama built here from their configs (no download), in float64.
"""
from __future__ import annotations

import math

import pytest
import torch

from gradcache import CachedLoss, FullBatch, GradCache
from gradcache.losses import InfoNCE
from tests.conftest import assert_grads_close, grads_of, zero

# the torch-only stage of .ci/run has neither (nor gradcache.models, the program's): the dev extra brings both
transformers = pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
peft = pytest.importorskip("peft", reason='the dev extra installs it: pip install -e ".[dev]"')
from gradcache.models import HuggingFaceEncoder  # noqa: E402

VOCAB = 64


def base_model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "bert":
        config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=32, max_position_embeddings=32, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0)
        return transformers.BertModel(config)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return transformers.LlamaModel(config)


def lora_encoder(kind: str, dropout: float) -> HuggingFaceEncoder:
    """peft's default targets for the model type (BERT: query, value; Llama: q_proj, v_proj), as a user writes it;
    the LoRA weights randomised (B starts at zero, which would leave A without a gradient)."""
    model = peft.get_peft_model(base_model(kind), peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout))
    torch.manual_seed(1)
    for name, param in model.named_parameters():
        if param.requires_grad:
            torch.nn.init.normal_(param, std=0.2)
    return HuggingFaceEncoder(model.double())


def batch(rows: int, seed: int) -> dict[str, torch.Tensor]:
    """Right-padded token ids of random lengths (1 to 12)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (rows, 12), generator=generator)
    lengths = torch.randint(1, 13, (rows,), generator=generator)
    mask = (torch.arange(12)[None, :] < lengths[:, None]).long()  # (rows, 12)
    return {"input_ids": ids * mask, "attention_mask": mask}


QUERIES, PASSAGES = batch(7, seed=2), batch(7, seed=3)


def chunked_reference(encoder: HuggingFaceEncoder, loss: torch.nn.Module, chunk_size: int) -> dict:
    """The full batch's loss and gradient, with the dropout masks GradCache's first pass draws: every chunk
    encoded with a graph, in its order, then one backward (FullBatch draws other masks in one pass)."""
    zero(encoder)
    embeddings = [torch.cat([encoder(**{k: v[i:i + chunk_size] for k, v in side.items()})
                             for i in range(0, 7, chunk_size)]) for side in (QUERIES, PASSAGES)]
    loss(*embeddings).backward()
    return lora_grads(encoder)


def lora_grads(encoder: HuggingFaceEncoder) -> dict:
    grads = grads_of(encoder)
    trained = {name for name, param in encoder.named_parameters() if param.requires_grad}
    assert trained and all("lora_" in name for name in trained)
    assert all(grads[f"0.{name}"] is None for name, param in encoder.named_parameters() if not param.requires_grad)
    return {name: grad for name, grad in grads.items() if name[2:] in trained}


def step(strategy: str, encoder: HuggingFaceEncoder, loss: torch.nn.Module, **options) -> dict:
    zero(encoder)
    torch.manual_seed(5)
    if strategy == "cached":
        CachedLoss(encoder, loss, 3, **options)(QUERIES, PASSAGES).backward()
    else:
        GradCache(encoder, loss, 3, **options).step(QUERIES, PASSAGES)
    return lora_grads(encoder)


CASES = {"gradcache": ("gradcache", {}), "cached": ("cached", {}),
         "trim_padding": ("gradcache", {"trim_padding": True}),
         "chunk_tokens": ("gradcache", {"chunk_tokens": 20}),  # 20 padded tokens: 1 to 3 rows a chunk
         "checkpointing": ("gradcache", {})}


# every case on BERT; the Llama (another architecture, rotary, no dropout of its own) on the plain step and
# under checkpointing
PAIRS = [("bert", case) for case in CASES] + [("llama", "gradcache"), ("llama", "checkpointing")]


@pytest.mark.parametrize(("kind", "case"), PAIRS)
def test_every_lora_parameter_gets_full_batchs_gradient_without_dropout(kind, case):
    strategy, options = CASES[case]
    encoder, loss = lora_encoder(kind, dropout=0.0), InfoNCE(temperature=0.1)
    encoder.set_grad_checkpointing(case == "checkpointing")
    FullBatch(encoder, loss).step(QUERIES, PASSAGES)
    want = lora_grads(encoder)
    assert_grads_close(step(strategy, encoder, loss, **options), want, 1e-10)


# not trim_padding: trimmed chunks draw masks of other shapes than the reference's untrimmed ones
@pytest.mark.parametrize(("kind", "case"), [("bert", "gradcache"), ("bert", "cached"), ("bert", "checkpointing"),
                                            ("llama", "gradcache")])
def test_lora_dropout_is_replayed(kind, case):
    """LoRA dropout 0.3: the gradient of the loss over the masks the first pass drew; the masks matter (the
    gradient differs from dropout off's, so a second pass with fresh masks would fail this test)."""
    strategy, options = CASES[case]
    encoder, loss = lora_encoder(kind, dropout=0.3), InfoNCE(temperature=0.1)
    encoder.set_grad_checkpointing(case == "checkpointing")
    torch.manual_seed(5)
    want = chunked_reference(encoder, loss, 3)
    got = step(strategy, encoder, loss, **options)
    assert_grads_close(got, want, 1e-10)
    without_dropout = lora_encoder(kind, dropout=0.0)
    FullBatch(without_dropout, loss).step(QUERIES, PASSAGES)
    differences = [(got[name] - grad).abs().max().item() for name, grad in lora_grads(without_dropout).items()]
    assert max(differences) > 1e-3


def test_the_base_weights_are_frozen_and_only_lora_is_optimised():
    encoder = lora_encoder("llama", dropout=0.1)
    optimizer = torch.optim.AdamW([p for p in encoder.parameters() if p.requires_grad], lr=1e-2)
    frozen = {name: param.detach().clone() for name, param in encoder.named_parameters() if not param.requires_grad}
    before = sum(param.numel() for param in encoder.parameters() if param.requires_grad)
    GradCache(encoder, InfoNCE(temperature=0.1), 3).step(QUERIES, PASSAGES)
    optimizer.step()
    assert before < sum(param.numel() for param in encoder.parameters()) / 10
    for name, param in encoder.named_parameters():
        if not param.requires_grad:
            assert torch.equal(param, frozen[name]), name
    assert len(optimizer.state) == sum(1 for p in encoder.parameters() if p.requires_grad)


def test_example_trains_a_lora_adapter(tmp_path, tiny_bert):
    """examples/peft_lora.py: a few steps on the tiny BERT, a finite loss, and an adapter that loads back."""
    from tests.integrations.test_examples import load

    loss = load("peft_lora").main(["--model", str(tiny_bert), "--steps", "2", "--batch-size", "8", "--chunk-size", "3",
                                   "--output-dir", str(tmp_path / "adapter")])
    assert math.isfinite(loss)
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
