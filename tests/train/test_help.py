"""`gradcache train --help` lists the modes and says where every option is; `gradcache train MODE --help` shows
every option of the mode, as both READMEs say."""
from pathlib import Path

import pytest

from gradcache.cli import main
from gradcache.train.modes import MODES

ROOT = Path(__file__).resolve().parents[2]


def test_train_help_lists_the_modes_and_points_to_their_options(capsys):
    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for mode in MODES.values():
        assert f"{mode.name} {' '.join(mode.help.split()[:3])}" in text
    assert "Every option of a mode, with its default: gradcache train MODE --help" in text


@pytest.mark.parametrize("mode", list(MODES))
def test_mode_help_shows_the_report_to_option_and_what_it_writes(capsys, mode):
    assert main(["train", mode, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--report-to {none,tensorboard,wandb}" in text and "train/<column> and eval/<metric>" in text


def test_the_readmes_say_what_train_help_shows():
    for readme in (ROOT / "README.md", ROOT / "gradcache" / "train" / "README.md"):
        text = readme.read_text()
        assert "gradcache train MODE --help" in text, readme
        for line in text.splitlines():  # `gradcache train --help` shows the modes, not every option
            assert "gradcache train --help" not in line or "every option" not in line, (readme, line)


def _help(capsys, *argv):
    assert main([*argv, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())


def _option_help(text, option):
    """The help of `option` alone: from its flag to the next option's."""
    return text.split(f" {option} ", 1)[1].split(" --", 1)[0]


def test_export_help_states_its_default_output_once(capsys):
    text = _help(capsys, "export")
    assert "(default: RUN/model)" in text and "(default: None)" not in text


def test_text_workers_help_does_not_speak_of_augmenting(capsys):
    assert "augment" not in _option_help(_help(capsys, "train", "text"), "--workers")


@pytest.mark.parametrize("mode", ["simclr", "clip"])
def test_image_modes_help_mentions_webdataset_shards(capsys, mode):
    data = _option_help(_help(capsys, "train", mode), "--data")
    assert "webdataset shards" in data and ".tar" in data
