"""StepProgress on stderr when it is not a terminal: a line every --progress-every seconds; --quiet silences it."""
import io
import re

from gradcache.cli import main
from gradcache.train.progress import StepProgress, duration
from tests.train.conftest import TINY


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _row(step, loss=2.5):
    return {"step": step, "loss": f"{loss:.6f}", "lr": "0.001", "samples_per_s": "64.0", "negatives_per_anchor": 30}


def test_a_line_every_n_seconds_with_step_loss_speed_and_eta():
    stream, clock = io.StringIO(), Clock()
    progress = StepProgress(total=100, start=0, description="gradcache train simclr", every=30, stream=stream,
                        clock=clock)
    for step in range(1, 101):
        clock.now = step * 10.0  # 10 s a step
        progress.update(_row(step))
    progress.close()
    lines = stream.getvalue().splitlines()
    # step 1, then every third step (30 s apart); the last, 100, falls among them
    assert [int(re.search(r"step (\d+)/100", line)[1]) for line in lines] == [1, *range(4, 101, 3)]
    assert lines[0].startswith("gradcache train simclr: step 1/100 (1%), loss 2.5000, 64.0 samples/s")
    halfway = next(line for line in lines if "step 49/100" in line)
    assert f"ETA {duration(51 * 10)}" in halfway and f"elapsed {duration(490)}" in halfway
    assert "ETA 0s" in lines[-1]


def test_a_resumed_run_counts_its_eta_from_its_own_steps():
    stream, clock = io.StringIO(), Clock()
    progress = StepProgress(total=10, start=6, description="d", every=0, stream=stream, clock=clock)
    clock.now = 5.0
    progress.update(_row(7))
    assert "step 7/10 (70%)" in stream.getvalue() and "ETA 15s" in stream.getvalue()


def test_disabled_prints_nothing():
    stream = io.StringIO()
    progress = StepProgress(total=3, start=0, description="d", every=0, enabled=False, stream=stream)
    for step in (1, 2, 3):
        progress.update(_row(step))
    assert stream.getvalue() == ""


def test_durations():
    assert [duration(s) for s in (0, 42, 455, 3720)] == ["0s", "42s", "7m 35s", "1h 02m"]


def _without_quiet(args):
    return [arg for arg in args if arg != "--quiet"]


def test_a_run_whose_stderr_is_not_a_terminal_prints_progress_lines(tmp_path, capsys):
    argv = ["train", "simclr", *_without_quiet(TINY["simclr"]), "--output-dir", str(tmp_path), "--progress-every", "0"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "gradcache train simclr: step 1/2 (50%), loss " in err and "gradcache train simclr: step 2/2 (100%)" in err
    assert "samples/s" in err and "ETA" in err


def test_quiet_silences_the_progress_lines(tmp_path, capsys):
    argv = ["train", "simclr", *TINY["simclr"], "--output-dir", str(tmp_path), "--progress-every", "0"]
    assert main(argv) == 0
    assert "step 1/2" not in capsys.readouterr().err
