"""The public losses' constructors: only what defines a loss goes by position; every option is keyword-only.

A loss takes ``temperature`` by position and nothing after it; ``Matryoshka`` takes its inner ``loss`` and ``dims``.
So ``InfoNCE(0.05, False, 1024, 4096)`` raises instead of setting ``column_tile_size=1024``.
"""

import inspect

import pytest

import gradcache.losses
from gradcache.losses import ClipLoss, InfoNCE, Matryoshka, NTXent, SigLipLoss

POSITIONAL = {  # each public loss: the parameters a call may pass by position, in order
    "InfoNCE": ("temperature",),
    "NTXent": ("temperature",),
    "ClipLoss": ("temperature",),
    "SigLipLoss": ("temperature",),
    "LateInteraction": ("temperature",),
    "ListwiseRerank": ("temperature",),
    "PointwiseRerank": ("temperature",),
    "Matryoshka": ("loss", "dims"),
    "SpladeLoss": ("loss", "document_regularizer_weight", "query_regularizer_weight"),
}
# public, but not losses: a queue the losses hold, and the sparsity penalties SpladeLoss holds
NOT_LOSSES = {"EmbeddingQueue", "FlopsRegularizer", "L1Regularizer"}


def test_the_table_names_every_public_loss():
    assert set(POSITIONAL) | NOT_LOSSES == set(gradcache.losses.__all__)


@pytest.mark.parametrize("name", sorted(POSITIONAL))
def test_every_option_is_keyword_only(name):
    parameters = inspect.signature(getattr(gradcache.losses, name)).parameters.values()
    positional = tuple(p.name for p in parameters
                       if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))
    assert positional == POSITIONAL[name]
    options = [p for p in parameters if p.name not in positional]
    assert options, f"{name} has no option"
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in options), [str(p) for p in options]


def test_the_positional_call_from_the_issue_raises_and_its_keywords_mean_a_queue():
    with pytest.raises(TypeError, match="positional"):
        InfoNCE(0.05, False, 1024, 4096)
    loss_fn = InfoNCE(0.05, symmetric=False, tile_size=1024, queue_size=4096)
    assert (loss_fn.tile_size, loss_fn.column_tile_size, loss_fn.queue_size) == (1024, None, 4096)


@pytest.mark.parametrize("call", [
    lambda: InfoNCE(0.05, True),
    lambda: NTXent(0.5, 4),
    lambda: ClipLoss(0.07, False),
    lambda: SigLipLoss(0.1, -10.0),
    lambda: Matryoshka(InfoNCE(), (4, 2), (1.0, 0.5)),
], ids=["InfoNCE", "NTXent", "ClipLoss", "SigLipLoss", "Matryoshka"])
def test_an_option_passed_by_position_raises(call):
    with pytest.raises(TypeError, match="positional"):
        call()
