"""`gradcache train text --guide MODEL`: GISTEmbed's guided filtering of false negatives. The step's loss equals
InfoNCE with the guide's embeddings of the same batch (encoded by the guide folder itself, from its own tokens),
the guide never trains and is not saved, GradCache equals one full batch with it, bad uses exit 2."""
import pytest
import torch
from gradcache.models import BiEncoder, HuggingFaceEncoder

import gradcache.train.run
from gradcache import losses
from gradcache.cli import main
from gradcache.train.checkpoints.atomic import load_checkpoint
from tests.tiny_text_model import write_tiny_bert
from tests.train.conftest import text_args

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')


@pytest.fixture
def guide_folder(tmp_path):
    return write_tiny_bert(tmp_path / "guide", seed=1)  # another model, with its own tokenizer


@pytest.fixture
def first_step(monkeypatch):
    """The run, the inputs of its first step, and what its loss was handed and returned at that step."""
    seen = {}
    step, build = gradcache.train.run.Run.step, gradcache.train.run.build_loss

    def recording_step(self, inputs, *args, **kwargs):
        seen.setdefault("run", self)
        seen.setdefault("inputs", inputs)
        return step(self, inputs, *args, **kwargs)

    def recording_loss(mode, config):
        loss = build(mode, config)
        def record(module, args, value):  # returns None: the loss's value stays as it is
            seen.setdefault("loss", (args, value.detach()))

        loss.register_forward_hook(record)
        return loss

    monkeypatch.setattr(gradcache.train.run.Run, "step", recording_step)
    monkeypatch.setattr(gradcache.train.run, "build_loss", recording_loss)
    return seen


def _split(rows, h=1):
    grouped = rows.view(-1, 1 + h, rows.shape[1])
    return grouped[:, 0], grouped[:, 1:].reshape(-1, rows.shape[1])


@pytest.mark.parametrize(("dims", "strategy", "margin"), [([16], "absolute", 0.0), ([16, 8], "relative", 0.01)],
                         ids=["plain", "matryoshka-relative"])
def test_the_step_loss_is_infonce_with_the_guide(tmp_path, tiny_bert, guide_folder, first_step, dims, strategy,
                                                 margin):
    before = {k: v.clone() for k, v in HuggingFaceEncoder(guide_folder).state_dict().items()}
    matryoshka = ["--matryoshka-dims", ",".join(map(str, dims))] if len(dims) > 1 else []
    assert main(text_args(tiny_bert, tmp_path / "run", "--negatives-per-query", "1", "--guide", str(guide_folder),
                          "--guide-margin-strategy", strategy, "--guide-margin", str(margin), *matryoshka)) == 0
    (query, passages, guide_query, guide_passages), value = first_step["loss"]
    assert not guide_query.requires_grad and not guide_passages.requires_grad  # encoded without a graph

    # the guide's embeddings, recomputed here by the folder's own encoder from its own tokens of the batch
    reference_guide = HuggingFaceEncoder(guide_folder).eval()
    with torch.no_grad():
        want_query, want_passages = (reference_guide(**tokens) for tokens in first_step["inputs"][2:])
    torch.testing.assert_close(guide_query, want_query, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(guide_passages, want_passages, rtol=1e-5, atol=1e-6)

    guided = losses.InfoNCE(temperature=0.05, margin_strategy=strategy, margin=margin)
    positive, negatives = _split(passages.detach())
    guide = (want_query, *_split(want_passages))
    want = sum(guided(query.detach()[:, :d], positive[:, :d], negatives[:, :d], guide=guide) for d in dims)
    unguided = sum(guided(query.detach()[:, :d], positive[:, :d], negatives[:, :d]) for d in dims)
    torch.testing.assert_close(value, want, rtol=1e-5, atol=1e-6)
    assert abs(float(want - unguided)) > 1e-3  # the guide did drop candidates: the test can fail

    run = first_step["run"]  # the guide never trained: not in the optimizer, its weights as loaded, not saved
    optimized = {id(p) for group in run.optimizer.param_groups for p in group["params"]}
    assert not any(id(p) in optimized or p.requires_grad for p in run.guide.parameters())
    for name, tensor in run.guide.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    saved = load_checkpoint(tmp_path / "run")["model"]
    assert saved.keys() == BiEncoder(HuggingFaceEncoder(tiny_bert)).state_dict().keys()


def test_gradcache_and_full_batch_train_the_same_model_with_a_guide(tmp_path, tiny_bert, guide_folder):
    for strategy in ("gradcache", "full"):
        assert main(text_args(tiny_bert, tmp_path / strategy, "--strategy", strategy, "--guide", str(guide_folder),
                              "--separate-towers", "--matryoshka-dims", "16,8", "--chunk-size", "3")) == 0
    cached, full = (load_checkpoint(tmp_path / s)["model"] for s in ("gradcache", "full"))
    for name in cached:
        torch.testing.assert_close(cached[name], full[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("extra", "fragments"), [
    (["--guide", "nowhere"], ["--guide nowhere", "no such folder"]),
    (["--queue-size", "4"], ["--guide needs the dense loss", "--queue-size 4"]),
    (["--tile-size", "4"], ["--guide needs the dense loss", "--tile-size 4"]),
    (["--guide-margin-strategy", "sideways"], ["--guide-margin-strategy", "sideways"]),
])
def test_bad_guide_options_exit_2_before_anything_is_written(tmp_path, tiny_bert, guide_folder, capsys, extra,
                                                            fragments):
    argv = text_args(tiny_bert, tmp_path / "out", "--guide", str(guide_folder), *extra)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert all(fragment in err for fragment in fragments), err
    assert not (tmp_path / "out").exists()
