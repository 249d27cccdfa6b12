"""Activation checkpointing: identical outputs and gradients, real recomputation, BatchNorm advanced once."""

import copy

import pytest
import torch
from torch import nn

from gradcache.models import (
    CLIP,
    ByteTokenizer,
    ConvNet,
    ProjectionHead,
    ResNetEncoder,
    SimCLRModel,
    TextEncoder,
    ViTEncoder,
)
from gradcache.models.checkpointing import run_block

TOKENIZER = ByteTokenizer(context_length=16)
TEXTS = ["a cat", "a small dog on grass", "x", "ééé"]


def _images(size: int = 16) -> torch.Tensor:
    return torch.randn(4, 3, size, size)


# Each case: (build model, make inputs as (args, kwargs)). Small sizes keep the suite fast.
CASES = {
    "convnet": (lambda: ConvNet(width=8, groups=4), lambda: ((_images(),), {})),
    "convnet_batchnorm": (lambda: ConvNet(width=8, norm="batch"), lambda: ((_images(),), {})),
    # ResNet is the slowest model here; one BatchNorm case covers its residual blocks.
    "resnet18_batchnorm": (lambda: ResNetEncoder(18, small_stem=True), lambda: ((_images(8),), {})),
    "vit": (lambda: ViTEncoder(image_size=16, patch_size=4, width=32, layers=2, heads=2), lambda: ((_images(),), {})),
    "text_dropout": (
        lambda: TextEncoder(TOKENIZER.vocab_size, context_length=16, width=32, layers=2, heads=2, dropout=0.2),
        lambda: ((), TOKENIZER(TEXTS)),
    ),
    "simclr": (lambda: SimCLRModel(ConvNet(width=8, groups=4), ProjectionHead(64, 32, 16)), lambda: ((_images(),), {})),
    "clip": (
        lambda: CLIP(
            ViTEncoder(image_size=16, patch_size=8, width=32, layers=1, heads=2),
            TextEncoder(TOKENIZER.vocab_size, context_length=16, width=32, layers=1, heads=2),
            embed_dim=16,
        ),
        lambda: ((_images(),), TOKENIZER(TEXTS)),
    ),
}


def _run(model: nn.Module, args, kwargs, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(seed)  # same dropout masks in both runs
    output = model(*args, **kwargs)
    output = torch.cat(output, dim=1) if isinstance(output, tuple) else output
    # A non-uniform upstream gradient, so every output element matters.
    weights = torch.linspace(-1.0, 2.0, output.numel()).reshape(output.shape)
    (output * weights).sum().backward()
    return output.detach(), [parameter.grad.clone() for parameter in model.parameters()]


def _count_block_calls(model: nn.Module) -> list[int]:
    """Count calls of the blocks run_block wraps. Pre-hooks, because checkpoint stops a recomputation as
    soon as it has every saved tensor back, before forward hooks would fire."""
    calls: list[int] = []
    block_types = {"BasicBlock", "EncoderBlock", "TransformerEncoderLayer"}
    blocks = [m for m in model.modules() if type(m).__name__ in block_types]
    blocks += [stage for m in model.modules() if isinstance(m, ConvNet) for stage in m.stages]
    for block in blocks:
        block.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("name", sorted(CASES))
def test_checkpointing_recomputes_blocks_with_identical_outputs_gradients_and_buffers(name):
    build, make_inputs = CASES[name]
    torch.manual_seed(0)
    plain = build().train()
    checkpointed = copy.deepcopy(plain)
    checkpointed.set_grad_checkpointing(True)
    plain_calls, checkpointed_calls = _count_block_calls(plain), _count_block_calls(checkpointed)
    args, kwargs = make_inputs()

    plain_output, plain_grads = _run(plain, args, kwargs, seed=1)
    checkpointed_output, checkpointed_grads = _run(checkpointed, args, kwargs, seed=1)

    assert len(plain_calls) > 0
    assert len(checkpointed_calls) == 2 * len(plain_calls), "each block should run again during backward"
    # Recomputation repeats the same float operations, so results agree to the last bits.
    torch.testing.assert_close(checkpointed_output, plain_output, rtol=1e-6, atol=1e-7)
    assert len(plain_grads) == len(checkpointed_grads)
    for plain_grad, checkpointed_grad in zip(plain_grads, checkpointed_grads):
        torch.testing.assert_close(checkpointed_grad, plain_grad, rtol=1e-6, atol=1e-7)
    # BatchNorm statistics advance once per forward, not again during recomputation.
    for plain_buffer, checkpointed_buffer in zip(plain.buffers(), checkpointed.buffers()):
        torch.testing.assert_close(checkpointed_buffer, plain_buffer, rtol=0, atol=0)


def test_disabling_checkpointing_stops_recomputation():
    build, make_inputs = CASES["convnet"]
    model = build()
    model.set_grad_checkpointing(True)
    model.set_grad_checkpointing(False)
    calls = _count_block_calls(model)
    args, _ = make_inputs()
    model(*args).sum().backward()
    assert len(calls) == len(model.stages)


def test_run_block_without_grad_runs_once_and_advances_batchnorm_once():
    block = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).train()
    calls = []
    block.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        run_block(block, torch.randn(5, 3), checkpointed=True)
    assert len(calls) == 1
    assert block[1].num_batches_tracked.item() == 1


def test_run_block_recomputation_keeps_batchnorm_statistics_and_restores_tracking():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).train()
    inputs = torch.randn(6, 3)
    reference = copy.deepcopy(block)
    reference(inputs)  # one plain forward: the statistics the checkpointed run must end with

    run_block(block, inputs, checkpointed=True).pow(2).sum().backward()

    norm, reference_norm = block[1], reference[1]
    assert norm.momentum == reference_norm.momentum, "the recomputation context must restore the momentum"
    assert norm.num_batches_tracked.item() == 1
    torch.testing.assert_close(norm.running_mean, reference_norm.running_mean, rtol=0, atol=0)
    torch.testing.assert_close(norm.running_var, reference_norm.running_var, rtol=0, atol=0)


def test_eval_mode_checkpointing_matches_plain_eval():
    torch.manual_seed(0)
    model = ConvNet(width=8, norm="batch")
    model.train()(_images())  # give the running statistics non-default values
    model.eval()
    images = _images()
    plain = model(images)
    model.set_grad_checkpointing(True)
    checkpointed = model(images)
    checkpointed.sum().backward()
    torch.testing.assert_close(checkpointed, plain, rtol=1e-6, atol=1e-7)
