"""A torchvision built for another torch is found at start (installation.py): one line naming both versions and
the fix, exit 2, no traceback. The failure is simulated: torchvision's import raises as a CPU torch beside a CUDA
torchvision makes it raise."""
import importlib

import pytest
import torch

from gradcache.cli import main
from gradcache.train import errors, installation

FAILURE = RuntimeError("operator torchvision::nms does not exist")


def _torchvision_fails(monkeypatch, failure):
    real = importlib.import_module

    def import_module(name, *args):
        if name == "torchvision":
            raise failure
        return real(name, *args)

    monkeypatch.setattr(installation.importlib, "import_module", import_module)
    monkeypatch.setattr(installation.importlib.metadata, "version",
                        lambda package: "0.99.0+cu999" if package == "torchvision" else "?")


def test_a_mismatched_torchvision_exits_2_in_one_line_naming_both_versions(monkeypatch, capsys):
    _torchvision_fails(monkeypatch, FAILURE)
    assert main(["train", "simclr", "--steps", "1"]) == errors.USAGE
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "torchvision 0.99.0+cu999" in err and f"torch {torch.__version__}" in err
    assert "torchvision::nms does not exist" in err and "pip install --force-reinstall torch torchvision" in err


def test_a_matching_or_absent_torchvision_says_nothing(monkeypatch):
    assert installation.torchvision_mismatch() is None  # this environment's pair
    _torchvision_fails(monkeypatch, ModuleNotFoundError("No module named 'torchvision'", name="torchvision"))
    assert installation.torchvision_mismatch() is None  # the train extra's check names a missing one


@pytest.mark.parametrize("failure", [RuntimeError(""), RuntimeError("Couldn't load custom C++ ops.\nmore")])
def test_the_message_holds_the_first_line_of_any_load_failure(monkeypatch, failure):
    _torchvision_fails(monkeypatch, failure)
    message = installation.torchvision_mismatch()
    assert message.count("\n") == 0 and ("RuntimeError" in message or "custom C++ ops" in message)
