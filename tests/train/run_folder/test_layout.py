"""RUN_FILES, the one list of names that mark a folder as a run's: `gradcache train` refuses such a folder without
--resume, and a MODEL argument naming it is taken for a run; both read the same list."""
import pytest

from gradcache.cli import main
from gradcache.train.checkpoints.deepspeed_checkpoint import DeepSpeedCheckpoint
from gradcache.train.checkpoints.run_checkpoint import KINDS
from gradcache.train.commands.model import is_run_path
from gradcache.train.run_folder.layout import RUN_FILES
from gradcache.train.run_folder.lock import LOCK_FILE
from gradcache.train.run_folder.log import METRICS, TRAIN_LOG


def test_every_checkpoint_kind_and_the_run_log_are_listed():
    for kind in (*KINDS.values(), DeepSpeedCheckpoint):
        assert {kind.name, kind.previous_name} <= set(RUN_FILES)
    assert {TRAIN_LOG, METRICS} <= set(RUN_FILES)


@pytest.mark.parametrize("name", RUN_FILES)
def test_a_folder_holding_one_is_a_run_to_train_and_to_model(tmp_path, tiny_args, capsys, name):
    run = tmp_path / "run"
    run.mkdir()
    (run / name).mkdir() if name.endswith((".dcp", ".ds")) else (run / name).write_text("")
    assert is_run_path(run)
    assert main(tiny_args("simclr", run)) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert {p.name for p in run.iterdir()} - {LOCK_FILE} == {name}  # nothing written beside it


def test_a_folder_holding_none_is_not_a_run(tmp_path):
    (tmp_path / "eval_log.csv").write_text("")
    assert not is_run_path(tmp_path)
