"""What the checks before a run cost: the model is built once per run start (a text run's check reads the
folder's config.json instead of loading the weights, a resume checks the checkpoint against the model the run
builds), and a `last.pt` read for its options does not stay in memory with its tensors."""
import pytest
import torch
from torch import nn

from gradcache.cli import main
from gradcache.losses import ClipLoss
from gradcache.models import HuggingFaceEncoder
from gradcache.train.checkpoints.run_checkpoint import FileCheckpoint, run_checkpoint
from gradcache.train.errors import CheckpointError
from gradcache.train.modes import text as text_mode
from tests.train.conftest import text_args


@pytest.fixture
def builds(monkeypatch):
    """How many times a Hugging Face model was loaded since the fixture started (every load the text mode makes)."""
    loads = []

    class Counted(HuggingFaceEncoder):
        def __init__(self, *args, **kwargs):
            loads.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(text_mode, "HuggingFaceEncoder", Counted)
    return loads


@pytest.mark.slow
def test_a_text_run_and_its_resume_each_build_the_model_once(tmp_path, tiny_bert, builds):
    out = tmp_path / "run"
    assert main(text_args(tiny_bert, out)) == 0
    assert len(builds) == 1  # the run's own; the check read config.json
    builds.clear()
    assert main(["train", "text", "--resume", str(out), "--steps", "3", "--quiet"]) == 0
    assert len(builds) == 1  # the resumed run's own; the checkpoint is checked against it when it loads


@pytest.mark.slow
def test_a_checkpoint_that_does_not_fit_the_model_is_refused_on_resume(tmp_path, tiny_bert, capsys):
    out = tmp_path / "run"
    assert main(text_args(tiny_bert, out)) == 0
    state = torch.load(out / "last.pt", weights_only=True)
    assert main(text_args(tiny_bert, tmp_path / "other", "--separate-towers")) == 0  # two towers: other keys
    other = torch.load(tmp_path / "other" / "last.pt", weights_only=True)
    del state["sha256"], other["sha256"]
    torch.save({**state, "model": other["model"]}, out / "last.pt")  # the options of one, the tensors of the other
    before = sorted(p.name for p in out.iterdir())
    capsys.readouterr()
    assert main(["train", "text", "--resume", str(out), "--steps", "3", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "does not fit the model" in err and "has unknown" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == before


def test_a_file_checkpoint_keeps_its_meta_not_its_tensors(tmp_path):
    torch.manual_seed(0)
    trained = nn.ModuleDict({"model": nn.Linear(4, 3), "loss": ClipLoss(learnable=True)})
    optimizer = torch.optim.AdamW(trained.parameters(), lr=0.1)
    trained["model"](torch.randn(2, 4)).sum().backward()
    optimizer.step()  # AdamW's moments: optimizer state as large as the model
    run_checkpoint(tmp_path, sharded=False).save(trained, optimizer, {"args": {"mode": "clip"}, "step": 3})
    saved = FileCheckpoint(tmp_path / "last.pt")
    saved.check()
    assert saved.meta() == {"args": {"mode": "clip"}, "step": 3}
    held = [value for value in vars(saved).values() if isinstance(value, dict)]
    assert held == [saved.meta()]  # the tensors of the model, the loss and the optimizer are not kept
    other = nn.ModuleDict({"model": nn.Linear(4, 3), "loss": ClipLoss(learnable=True)})
    saved.load(other, torch.optim.AdamW(other.parameters(), lr=0.1))  # read from the file again
    for name, value in trained.state_dict().items():
        assert torch.equal(other.state_dict()[name], value), name
    with pytest.raises(CheckpointError, match="lacks"):
        saved.load(nn.ModuleDict({"model": nn.Sequential(nn.Linear(4, 3)), "loss": ClipLoss(learnable=True)}))
