"""`gradcache train clip --model open_clip:ARCH`: an open_clip architecture (built without weights, never
downloaded) trained and evaluated by the program, and `--pretrained` loading a local checkpoint file; a SigLIP
architecture (a tiny one registered by the test) trains with SigLipLoss, its temperature and bias learned."""
import json
import math

import pytest
import torch

from gradcache import FullBatch, GradCache, NaiveAccumulation
from gradcache.cli import main
from gradcache.losses import ClipLoss, SigLipLoss
from gradcache.train.config import RunConfig
from gradcache.train.modes import MODES
from tests.conftest import assert_grads_close, grads_of, zero

open_clip = pytest.importorskip("open_clip")  # the open-clip extra, which dev installs

from gradcache.models.open_clip import OpenClipTokenizer  # noqa: E402
from tests.tiny_open_clip import (  # noqa: E402
    TINY_SIGLIP,
    TINY_SIGLIP_BIAS,
    TINY_SIGLIP_CONFIG,
    register_tiny_siglip,
)

ARCHITECTURE = "ViT-S-32-alt"  # the smallest open_clip architecture with its own towers
RUN = ["train", "clip", "--model", f"open_clip:{ARCHITECTURE}", "--image-size", "32", "--train-size", "32",
       "--test-size", "16", "--batch-size", "8", "--chunk-size", "4", "--steps", "1", "--warmup", "1", "--quiet",
       "--workers", "0", "--threads", "1"]


# An architecture of the same kinds of towers, registered as a user registers a config of their own: one block
# each and 16 tokens, so that a run's three evaluations (zero-shot prompts included) take a second, not ten.
TINY_ARCHITECTURE = {"embed_dim": 16, "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16,
                                                     "patch_size": 16},
                     "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}


@pytest.fixture(scope="module")
def tiny_architecture(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("open_clip_configs") / "gradcache-tests-tiny.json"
    path.write_text(json.dumps(TINY_ARCHITECTURE))
    open_clip.add_model_config(path)
    return path.stem


@pytest.mark.slow
def test_an_open_clip_run_trains_evaluates_and_is_read_back_by_eval(tmp_path, capsys, tiny_architecture):
    run = [*RUN[:3], f"open_clip:{tiny_architecture}", *RUN[4:]]
    assert main([*run, "--output-dir", str(tmp_path / "run")]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["steps"] == 1 and 0 <= metrics["image_to_text_recall@1"] <= 100
    assert set(metrics["step0"]) >= {"image_to_text_recall@1", "text_to_image_recall@1"}
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run")]) == 0  # rebuilt from the stored options, no pretrained file needed
    evaluated = json.loads(capsys.readouterr().out)
    for key in ("image_to_text_recall@1", "text_to_image_recall@10", "zero_shot_top1"):
        assert evaluated[key] == pytest.approx(metrics[key])


@pytest.mark.slow
def test_pretrained_weights_and_temperature_load_on_a_new_run(tmp_path):
    torch.manual_seed(123)
    source = open_clip.create_model(ARCHITECTURE, force_image_size=32)
    with torch.no_grad():
        source.logit_scale.fill_(math.log(1 / 0.05))
    path = tmp_path / "weights.pt"
    torch.save(source.state_dict(), path)

    mode, config = MODES["clip"], RunConfig(mode="clip", model=f"open_clip:{ARCHITECTURE}", image_size=32,
                                            pretrained=str(path), temperature=0.07)
    mode.check_model(config)
    torch.manual_seed(0)
    model, loss = mode.build_model(config), mode.build_loss(config)
    state = torch.get_rng_state()
    mode.initialise(config, model, loss)
    assert torch.equal(torch.get_rng_state(), state)  # reading the file draws no random numbers of the run
    for name, value in source.visual.state_dict().items():
        torch.testing.assert_close(model.image_tower.visual.state_dict()[name], value, rtol=0, atol=0)
    text = {k: v for k, v in source.state_dict().items() if not k.startswith("visual.") and k != "logit_scale"}
    loaded = model.text_tower.model.state_dict()
    for name, value in text.items():
        torch.testing.assert_close(loaded[name], value, rtol=0, atol=0)
    assert loss.temperature == pytest.approx(0.05)


@pytest.mark.parametrize("argv, message", [
    ([*RUN[:3], "open_clip:no-such-architecture", *RUN[4:]], "not an open_clip architecture"),
    ([*RUN, "--pretrained", "missing.pt"], "is not a file"),
    (["train", "clip", "--pretrained", "weights.pt", "--steps", "1"], "needs --model open_clip:ARCH"),
    (["train", "simclr", "--model", f"open_clip:{ARCHITECTURE}", "--steps", "1"], "not an image encoder preset"),
])
def test_bad_open_clip_options_exit_2_and_write_nothing(tmp_path, capsys, argv, message):
    output = tmp_path / "run"
    assert main([*argv, "--output-dir", str(output)]) == 2
    assert message in capsys.readouterr().err
    assert not output.exists()


@pytest.mark.parametrize("model, size, patch, nearest", [(f"open_clip:{ARCHITECTURE}", 60, 32, "32 or 64"),
                                                         ("vit_tiny", 30, 4, "28 or 32")])
def test_an_image_size_the_patches_do_not_tile_exits_2_naming_the_nearest_sizes(tmp_path, capsys, model, size,
                                                                                 patch, nearest):
    """A ViT's patches must tile the image: 60 px on a 32 px patch would train on the top-left 32 px only."""
    argv = [*RUN[:3], model, "--image-size", str(size), *RUN[6:]]
    assert main([*argv, "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"--image-size {size}" in err and f"patch size {patch}" in err
    assert f"use --image-size {nearest}" in err
    assert not (tmp_path / "run").exists()


# --- a SigLIP architecture: the sigmoid loss with a learned temperature and bias ------------------------------
SIGLIP_RUN = ["train", "clip", "--model", f"open_clip:{register_tiny_siglip()}", "--image-size", "32",
              "--train-size", "32", "--test-size", "16", "--batch-size", "8", "--chunk-size", "4", "--steps", "1",
              "--warmup", "1", "--quiet", "--workers", "0", "--threads", "1"]


def _siglip_config(**options) -> RunConfig:
    return RunConfig(mode="clip", model=f"open_clip:{TINY_SIGLIP}", image_size=32, temperature=0.07, **options)


def test_a_siglip_architecture_trains_with_the_sigmoid_loss_at_its_bias():
    mode, config = MODES["clip"], _siglip_config(tile_size=4)
    mode.check_model(config)
    loss = mode.build_loss(config)
    assert isinstance(loss, SigLipLoss) and loss.tile_size == 4
    assert {name for name, p in loss.named_parameters() if p.requires_grad} == {"logit_scale", "bias"}
    assert loss.temperature == pytest.approx(0.07) and loss.bias.item() == TINY_SIGLIP_BIAS
    assert isinstance(MODES["clip"].build_loss(RunConfig(mode="clip", model=f"open_clip:{ARCHITECTURE}")), ClipLoss)


@pytest.mark.parametrize("tile_size", [None, 3])
def test_gradcache_over_the_siglip_towers_equals_full_batch_on_every_parameter(tile_size):
    mode, config = MODES["clip"], _siglip_config(tile_size=tile_size)
    torch.manual_seed(0)
    model, loss = mode.build_model(config).double(), mode.build_loss(config).double()
    images = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 2 - 1
    tokens = OpenClipTokenizer(TINY_SIGLIP)([f"a {c} shape number {i}" for i, c in enumerate("rgbcmy")])["input_ids"]
    modules = (model, loss)

    def gradients(strategy):
        zero(*modules)
        value = strategy(mode.encoders(model), loss).step(images, tokens)
        return value, grads_of(*modules)

    want_loss, want = gradients(FullBatch)
    assert set(want) >= {"1.logit_scale", "1.bias"} and want["1.bias"].abs() > 0
    got_loss, got = gradients(lambda encoders, loss_fn: GradCache(encoders, loss_fn, chunk_size=2))
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-10, atol=1e-12)
    assert_grads_close(got, want, 1e-8)
    _, naive = gradients(lambda encoders, loss_fn: NaiveAccumulation(encoders, loss_fn, chunk_size=2))
    assert not torch.allclose(naive["1.bias"], want["1.bias"], rtol=1e-3)  # fewer pairs per loss: another gradient


def test_a_pretrained_siglip_checkpoint_gives_its_temperature_and_bias(tmp_path):
    torch.manual_seed(3)
    source = open_clip.create_model(TINY_SIGLIP, force_image_size=32)
    with torch.no_grad():
        source.logit_scale.fill_(math.log(1 / 0.05))
        source.logit_bias.fill_(-3.5)
    path = tmp_path / "weights.pt"
    torch.save(source.state_dict(), path)
    mode, config = MODES["clip"], _siglip_config(pretrained=str(path))
    model, loss = mode.build_model(config), mode.build_loss(config)
    mode.initialise(config, model, loss)
    assert loss.temperature == pytest.approx(0.05) and loss.bias.item() == pytest.approx(-3.5)
    torch.testing.assert_close(model.image_tower.visual.conv1.weight, source.visual.conv1.weight, rtol=0, atol=0)
    assert not hasattr(model, "temperature")  # the loss holds it, nowhere else


@pytest.mark.slow
def test_a_siglip_run_learns_its_bias_and_eval_reads_it_back(tmp_path, capsys):
    assert main([*SIGLIP_RUN, "--output-dir", str(tmp_path / "run")]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    saved = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["loss"]
    assert set(saved) == {"logit_scale", "bias"} and metrics["bias"] == pytest.approx(saved["bias"].item())
    assert metrics["bias"] != TINY_SIGLIP_BIAS  # a learned parameter: one step moved it
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run")]) == 0
    assert json.loads(capsys.readouterr().out)["image_to_text_recall@1"] == pytest.approx(
        metrics["image_to_text_recall@1"])


def test_an_architecture_named_siglip_without_a_hub_tokenizer_is_refused(tmp_path):
    from gradcache.integrations.open_clip import check_architecture

    path = tmp_path / "my-siglip.json"
    path.write_text(json.dumps(TINY_SIGLIP_CONFIG))
    open_clip.add_model_config(path)
    with pytest.raises(ValueError, match="downloads"):
        check_architecture("my-siglip")
