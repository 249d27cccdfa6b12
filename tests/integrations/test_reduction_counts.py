"""One gradient synchronisation per optimizer step in the trainers' DDP runs, shown able to fail: the same step
without the library's hold on synchronisation, on two gloo ranks with several chunks.

- sentence-transformers' `SentenceTransformerTrainer` wraps the encoder in DDP and GradCacheLoss runs every chunk
  through it (4 rows per rank in chunks of 2, three columns: six chunk backward passes). With the library's
  `gradient_sync` (DDP's `no_sync` for all but the last chunk) the step all-reduces as often as MultipleNegatives-
  RankingLoss's one ordinary backward (tests/integrations/test_sentence_transformers_trainer.py checks the
  gradients too); without it, every chunk's backward all-reduces: six times as often.
- `GradCacheTrainer` under DDP wraps the whole loss: every chunk's backward but the last reaches `.grad` without
  DDP's hooks (`accumulate_without_hooks`), so the step all-reduces as one ordinary DDP step does
  (tests/integrations/test_huggingface.py counts it); with every chunk's backward an ordinary one, DDP refuses
  the second reduction of the same gradients ("Expected to mark a variable ready only once"), so no count can
  exceed one.
- DeepSpeed under GradCacheTrainer: tests/integrations/test_huggingface_deepspeed.py.

Counted with a DDP communication hook (`tests.integrations.towers.count_allreduces`): one entry per bucket
all-reduce.
"""
from __future__ import annotations

import contextlib
import os

import pytest
import torch

pytest.importorskip("accelerate")
pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")
pytest.importorskip("datasets")

from gradcache import cache  # noqa: E402
from tests.integrations import test_huggingface as huggingface_trainer  # noqa: E402
from tests.integrations import test_sentence_transformers_trainer as st_trainer  # noqa: E402
from tests.integrations.sentence_models import save_tiny_bert  # noqa: E402
from tests.multiprocess import run_on_ranks  # noqa: E402

CHUNKS_PER_STEP = 6  # 4 rows per rank in chunks of 2 (st_trainer.train's chunk_size), three columns


@contextlib.contextmanager
def replaced(name: str, value):
    """gradcache.cache's `name` replaced for the block (the negative controls)."""
    original = getattr(cache, name)
    setattr(cache, name, value)
    try:
        yield
    finally:
        setattr(cache, name, original)


def every_backward_syncs(module, enabled, fsdp_reduce="chunk"):
    return contextlib.nullcontext()  # no no_sync: each chunk's backward all-reduces


def worker(rank: int, world_size: int, folder: str) -> dict:
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1")
    from accelerate.state import AcceleratorState

    results = {}
    for name, ours, control in (("ours", True, contextlib.nullcontext()), ("mnrl", False, contextlib.nullcontext()),
                                ("every_chunk", True, replaced("gradient_sync", every_backward_syncs))):
        AcceleratorState._reset_state(True)
        with control:
            trainer, grab = st_trainer.train(folder, ours=ours, gather=True, per_device_train_batch_size=4)
        results[name] = {"allreduces": len(trainer.allreduces), "wrapper": type(trainer.model_wrapped).__name__}
    AcceleratorState._reset_state(True)
    with replaced("holds_its_own_sync", lambda module: True):  # every chunk's backward an ordinary one
        try:
            huggingface_trainer.train(os.path.join(folder, f"hf{rank}"), per_device_train_batch_size=4)
            results["hf_every_chunk"] = "not refused"
        except RuntimeError as error:
            results["hf_every_chunk"] = str(error)
    return results


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reduction-counts")
    save_tiny_bert(folder / "bert")
    return run_on_ranks(worker, 2, str(folder))


@pytest.mark.slow
def test_sentence_transformers_trainer_reduces_once_and_would_reduce_per_chunk_without_no_sync(ranks):
    for r in ranks:
        ours, mnrl, every_chunk = r["ours"]["allreduces"], r["mnrl"]["allreduces"], r["every_chunk"]["allreduces"]
        assert r["ours"]["wrapper"] == "DistributedDataParallel"
        assert ours == mnrl >= 1
        assert every_chunk == CHUNKS_PER_STEP * mnrl


@pytest.mark.slow
def test_hugging_face_trainer_under_ddp_cannot_reduce_twice(ranks):
    for r in ranks:
        assert r["hf_every_chunk"] != "not refused"
        assert "mark a variable ready only once" in r["hf_every_chunk"], r["hf_every_chunk"]
