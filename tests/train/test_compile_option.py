"""`gradcache train --compile`: a compiled run trains the model of the same eager run (dropout on, so the
replayed masks must be the eager ones), its checkpoint and export carry the eager names, it resumes with and
without --compile, and a backend that cannot compile is refused (exit 2) before or at the step it fails."""
import csv
from unittest import mock

import pytest
import torch
from torch._dynamo.utils import counters

from gradcache.cli import main
from gradcache.train import compilation, errors
from gradcache.train.checkpoints.atomic import load_checkpoint
from gradcache.train.config import RunConfig
from tests.tiny_text_model import write_tiny_bert
from tests.train.kinds.sparse_models import write_tiny_splade
from tests.train.conftest import TINY, text_args

pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
AOT = ["--compile", "--compile-backend", "aot_eager"]  # no C++ compiler needed
# one chunk shape (every text cut to 8 tokens, no hard negatives), so three graphs: phase (1)'s without grad,
# phase (3)'s with it, and evaluation's
SHAPES = ["--max-length", "8", "--negatives-per-query", "0", "--checkpoint-every", "1"]


@pytest.fixture(scope="module")
def dropout_bert(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("models") / "dropout_bert", dropout=0.1)


@pytest.fixture(scope="module")
def eager_text(tmp_path_factory, dropout_bert):
    """The eager run every compiled text run is compared with."""
    folder = tmp_path_factory.mktemp("eager")
    assert main(text_args(dropout_bert, folder, *SHAPES)) == 0
    return folder


@pytest.fixture(autouse=True)
def fresh_compiler():
    """Dynamo's caches emptied: a run compiles its encoders afresh instead of reusing an earlier test's graphs, so
    `compiled_graphs()` counts this test's."""
    torch._dynamo.reset()
    counters.clear()


def compiled_graphs():
    return counters["stats"]["unique_graphs"]


def _losses(folder):
    with open(folder / "train_log.csv", newline="") as handle:
        return [(int(row["step"]), float(row["loss"])) for row in csv.DictReader(handle)]


def assert_same_run(got, want, tolerance=1e-5):
    """The same logged losses and final weights (within float tolerance: a compiled graph may fuse or reorder),
    under the same parameter names: no `_orig_mod.` of a compiled wrapper."""
    got_losses, want_losses = _losses(got), _losses(want)
    assert [step for step, _ in got_losses] == [step for step, _ in want_losses]
    assert [loss for _, loss in got_losses] == pytest.approx([loss for _, loss in want_losses], rel=tolerance)
    got_state, want_state = (load_checkpoint(folder)["model"] for folder in (got, want))
    assert list(got_state) == list(want_state)
    assert not [name for name in got_state if "_orig_mod" in name]
    for name, value in want_state.items():
        assert torch.allclose(got_state[name], value, rtol=tolerance, atol=tolerance * 1e-1), name


@pytest.mark.slow
def test_a_compiled_run_trains_the_eager_model(tmp_path, dropout_bert, eager_text):
    """aot_eager, dropout 0.1, the recompute check on (the default): a mask the replay missed would raise there,
    and one the compiled graph drew otherwise than eager would change the losses."""
    assert main(text_args(dropout_bert, tmp_path, *SHAPES, *AOT)) == 0
    assert compiled_graphs() >= 2  # phase (1)'s graph and phase (3)'s, at least
    assert_same_run(tmp_path, eager_text)
    stored = RunConfig.from_dict(load_checkpoint(tmp_path)["args"])
    assert stored.compile and stored.compile_backend == "aot_eager"


def test_an_unknown_backend_exits_2_and_writes_nothing(tmp_path, tiny_bert, capsys):
    assert main(text_args(tiny_bert, tmp_path / "run", "--compile", "--compile-backend", "nope")) == errors.USAGE
    assert "--compile-backend 'nope' is not a torch.compile backend" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_inductor_without_a_cpp_compiler_exits_2_and_writes_nothing(tmp_path, tiny_bert, capsys):
    with mock.patch.object(compilation, "_has_cpp_compiler", return_value=False):
        assert main(text_args(tiny_bert, tmp_path / "run", "--compile")) == errors.USAGE
    message = capsys.readouterr().err
    assert "--compile-backend inductor on the CPU needs a C++ compiler" in message and "aot_eager" in message
    assert not (tmp_path / "run").exists()


def test_inductor_on_cuda_without_triton_is_refused():
    config = RunConfig(mode="text", device="cuda:1", compile=True)
    with mock.patch.object(compilation, "_has_triton", return_value=False):
        with pytest.raises(errors.UsageError, match="inductor on --device cuda:1 needs Triton"):
            compilation.check_compile(config)
    with mock.patch.object(compilation, "_has_triton", return_value=True):
        compilation.check_compile(config)  # with Triton: accepted


def test_without_compile_the_backend_is_not_checked():
    """--compile-backend alone compiles nothing, so nothing about it is refused (and torch._dynamo not read)."""
    compilation.check_compile(RunConfig(compile_backend="nope"))
    assert compilation.compile_errors(RunConfig()) == ()


@pytest.fixture
def failing_backend():
    """A torch.compile backend that fails on every graph, as a backend bug or a missing toolchain would."""
    from torch._dynamo import register_backend
    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS

    name = "gradcache_test_failing_backend"

    def fail(graph, example_inputs):
        raise RuntimeError("this backend compiles nothing")

    register_backend(fail, name=name)
    yield name
    _COMPILER_FNS.pop(name, None)
    _BACKENDS.pop(name, None)


@pytest.mark.slow
def test_a_backend_that_fails_at_the_first_step_exits_2_naming_the_cause(tmp_path, tiny_bert, failing_backend,
                                                                          capsys):
    code = main(text_args(tiny_bert, tmp_path, "--compile", "--compile-backend", failing_backend))
    assert code == errors.USAGE
    message = capsys.readouterr().err
    assert f"--compile-backend {failing_backend} failed to compile the encoders at step 1" in message
    assert "this backend compiles nothing" in message and "drop --compile" in message
    assert not (tmp_path / "last.pt").exists()


@pytest.mark.slow  # inductor builds C++ kernels: about 35 s
def test_inductor_trains_the_eager_model_and_its_export_loads(tmp_path, dropout_bert, eager_text):
    """Inductor with dropout: its masks drawn by torch's own ops (fallback_random), the eager run's; the export
    is a sentence-transformers folder that encodes as the eager run's does."""
    if not compilation._has_cpp_compiler():
        pytest.skip("inductor on the CPU needs a C++ compiler (g++) and none is installed here; the same run under "
                    "aot_eager is test_a_compiled_run_trains_the_eager_model")
    sentence_transformers = pytest.importorskip("sentence_transformers")
    assert main(text_args(dropout_bert, tmp_path, *SHAPES, "--compile")) == 0
    assert compiled_graphs() >= 2
    assert_same_run(tmp_path, eager_text)
    texts = ["who bakes bread?", "the mill by the river"]
    got, want = (sentence_transformers.SentenceTransformer(str(folder / "model"), device="cpu").encode(
        texts, convert_to_tensor=True) for folder in (tmp_path, eager_text))
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.slow  # three program runs, two of them compiled
@pytest.mark.parametrize("resume", [AOT, []], ids=["compiled", "eager"])
def test_a_compiled_run_resumes_with_and_without_compile(tmp_path, dropout_bert, eager_text, killed_after_step,
                                                         resume):
    """Killed after step 2 (its checkpoint at step 1), resumed compiled or eager: the eager whole run."""
    killed_after_step(2, text_args(dropout_bert, tmp_path, *SHAPES, *AOT))
    assert load_checkpoint(tmp_path)["step"] == 1
    torch._dynamo.reset()
    counters.clear()
    assert main(["train", "text", "--resume", str(tmp_path), "--quiet", *resume]) == 0
    assert (compiled_graphs() >= 2) == bool(resume)  # the resumed run compiled only when asked
    assert_same_run(tmp_path, eager_text)
    assert RunConfig.from_dict(load_checkpoint(tmp_path)["args"]).compile == bool(resume)


KINDS = {
    "simclr": lambda model, folder: ["train", "simclr", *TINY["simclr"], "--output-dir", str(folder)],
    "clip": lambda model, folder: ["train", "clip", *TINY["clip"], "--output-dir", str(folder)],
    "multi-vector": lambda model, folder: text_args(model, folder, "--kind", "multi-vector", "--token-dim", "8"),
    "sparse": lambda model, folder: text_args(model, folder, "--kind", "sparse"),
    "cross-encoder": lambda model, folder: text_args(model, folder, "--kind", "cross-encoder",
                                                     "--negatives-per-query", "1"),
}


@pytest.mark.slow  # compiling each mode's encoders: 5-15 s a case
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_mode_and_kind_compiles_to_the_eager_run(tmp_path, dropout_bert, kind):
    model = write_tiny_splade(tmp_path / "splade", dropout=0.1) if kind == "sparse" else dropout_bert
    argv = KINDS[kind]
    assert main(argv(model, tmp_path / "eager")) == 0
    assert main([*argv(model, tmp_path / "compiled"), *AOT]) == 0
    assert compiled_graphs() >= 2
    assert_same_run(tmp_path / "compiled", tmp_path / "eager")


@pytest.mark.slow  # two one-process runs in a gloo group each: about 10 s
@pytest.mark.parametrize("placement", ["fsdp", "deepspeed"])
def test_a_sharded_placement_wraps_the_compiled_encoder(tmp_path, placement):
    """FSDP2 shards, or a DeepSpeed ZeRO-2 engine wraps, the encoder compiled in place: the eager run's losses."""
    if placement == "fsdp":
        options = ["--fsdp"]
    else:
        config = tmp_path / "ds.json"
        config.write_text('{"zero_optimization": {"stage": 2}}')
        options = ["--deepspeed", str(config)]
    argv = ["train", "simclr", *TINY["simclr"], *options]
    assert main([*argv, "--output-dir", str(tmp_path / "eager")]) == 0
    assert main([*argv, "--output-dir", str(tmp_path / "compiled"), *AOT]) == 0
    assert compiled_graphs() >= 2
    got, want = _losses(tmp_path / "compiled"), _losses(tmp_path / "eager")
    assert [loss for _, loss in got] == pytest.approx([loss for _, loss in want], rel=1e-5)
