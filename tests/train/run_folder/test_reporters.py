"""`--report-to` refuses what it cannot do before a run writes anything: an unknown name (argparse, naming the
choices), `none` beside a reporter, a reporter whose package is not installed (naming the install), exit 2."""
import sys

import pytest

from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.run_folder.reporters import REPORT_TO


@pytest.mark.parametrize(("values", "message"), [
    (["wandb-cloud"], "argument --report-to: invalid choice: 'wandb-cloud' (choose from"),
    (["none", "tensorboard"], "'none' reports nowhere and cannot go with another reporter"),
])
def test_bad_values_exit_2_naming_the_choices_and_write_nothing(tmp_path, tiny_args, capsys, values, message):
    folder = tmp_path / "run"
    assert main(tiny_args("simclr", folder, "--report-to", *values)) == errors.USAGE
    stderr = capsys.readouterr().err
    assert message in stderr
    if "invalid choice" in message:
        assert all(choice in stderr.splitlines()[-1].split("choose from")[1] for choice in REPORT_TO)
    assert not folder.exists()


@pytest.mark.parametrize("reporter", ["tensorboard", "wandb"])
def test_without_its_package_it_exits_2_naming_the_install(tmp_path, tiny_args, capsys, monkeypatch, reporter):
    monkeypatch.setitem(sys.modules, reporter, None)  # `import <package>` fails as if it were not installed
    folder = tmp_path / "run"
    assert main(tiny_args("simclr", folder, "--report-to", reporter)) == errors.USAGE
    stderr = capsys.readouterr().err
    assert f"--report-to {reporter} needs the {reporter} package" in stderr and f"pip install {reporter}" in stderr
    assert not folder.exists()
