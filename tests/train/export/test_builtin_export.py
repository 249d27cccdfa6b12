"""A simclr or clip model's RUN/model (built-in encoders) is rebuilt by gradcache.models.from_pretrained, and a ResNet
image encoder loads into torchvision's own ResNet with the loading lines of its README."""
import json

import pytest
import torch

import gradcache.models
from gradcache.cli import main
from gradcache.train.config import RunConfig
from gradcache.train.model_folders import ModelFolderFormat, model_folder_format
from gradcache.train.export.write import export_model
from gradcache.train.modes import MODES, mode_of
from tests.train.export.helpers import program_model

torchvision = pytest.importorskip("torchvision")


def _images(size, count=5):
    return torch.rand(count, 3, size, size, generator=torch.Generator().manual_seed(0)) * 2 - 1  # in [-1, 1]


@pytest.mark.slow
@pytest.mark.parametrize("preset, norm, image_size", [("resnet18", "group", 16), ("resnet18", "batch", 16),
                                                      ("resnet18", "group", 72), ("convnet", "group", 16)])
def test_simclr_from_pretrained_and_torchvision(tmp_path, preset, norm, image_size):
    """Exported as a run ends (export_model), from random weights and BatchNorm statistics: no training needed."""
    config = RunConfig(mode="simclr", model=preset, norm=norm, image_size=image_size, width=8, hidden_dim=32,
                       projection_dim=16)
    mode = MODES["simclr"]
    torch.manual_seed(0)
    model, loss = mode.build_model(config).eval(), mode.build_loss(config)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):  # statistics a run would have learned, not the 0 / 1 start
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    exported = export_model(config, model, loss, tmp_path / "model", mode=mode_of(config))
    assert model_folder_format(exported) is ModelFolderFormat.BUILT_IN
    images = _images(config.image_size)
    rebuilt = gradcache.models.from_pretrained(exported)
    assert not rebuilt.training
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.embed(images), model.embed(images))
        torch.testing.assert_close(rebuilt(images), model(images))
    stored = gradcache.models.read_pretrained_config(exported)
    assert stored.image_size == config.image_size and "[-1, 1]" in stored.preprocessing["images"]
    files = {path.name for path in exported.iterdir()}
    assert (f"torchvision_{preset}.safetensors" in files) == (preset == "resnet18")
    if preset == "resnet18":  # the README's lines, run as written, with RUN/model replaced by the folder
        readme = (exported / "README.md").read_text()
        lines = readme.split("torchvision (the image encoder alone)")[1].split("```python\n")[1].split("```")[0]
        assert ("conv1" in lines) == (image_size <= 64) and ("GroupNorm" in lines) == (norm == "group")
        scope = {}
        exec(lines.replace("RUN/model", str(exported)), scope)
        net = scope["net"].eval()
        assert type(net) is torchvision.models.ResNet
        with torch.no_grad():
            torch.testing.assert_close(net(images), model.embed(images))


def test_clip_from_pretrained_with_its_tokenizer_and_temperature(tmp_path, tiny_args):
    assert main(tiny_args("clip", tmp_path / "run")) == 0
    exported = tmp_path / "run" / "model"
    config, model, loss = program_model(tmp_path / "run")
    rebuilt = gradcache.models.from_pretrained(exported)
    stored = gradcache.models.read_pretrained_config(exported)
    assert stored.temperature == pytest.approx(loss.temperature, rel=1e-6)
    assert stored.temperature != pytest.approx(config.temperature)  # the learned one, not the option's
    tokens = stored.tokenizer()(["a large red star", "a small blue circle on a dark background"])
    images = _images(config.image_size)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.encode_image(images), model.encode_image(images))
        torch.testing.assert_close(rebuilt.encode_text(**tokens), model.encode_text(**tokens))


def test_from_pretrained_refuses_a_folder_that_is_not_one(tmp_path, tiny_bert):
    with pytest.raises(ValueError, match="not a gradcache built-in encoder"):
        gradcache.models.from_pretrained(tiny_bert)  # a Hugging Face config.json
    with pytest.raises(FileNotFoundError, match="config.json"):
        gradcache.models.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"gradcache_architecture": "simclr"}))
    with pytest.raises(ValueError, match="lacks"):
        gradcache.models.from_pretrained(tmp_path)
