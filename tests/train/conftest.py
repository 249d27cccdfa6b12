"""Tiny runs of the training program: 64 images at 16 x 16 (32 text pairs), the smallest models, a couple of
steps."""
import pytest

TINY = {
    "simclr": ["--train-size", "64", "--test-size", "32", "--image-size", "16", "--batch-size", "16",
               "--chunk-size", "8", "--steps", "2", "--width", "8", "--hidden-dim", "32", "--projection-dim", "16",
               "--knn-k", "5", "--warmup", "1", "--quiet",
               "--workers", "0"],
    "clip": ["--train-size", "64", "--test-size", "32", "--image-size", "16", "--batch-size", "16",
             "--chunk-size", "8", "--steps", "2", "--width", "8", "--projection-dim", "16", "--text-width", "16",
             "--text-layers", "1", "--text-heads", "2", "--warmup", "1", "--quiet", "--workers", "0"],
    "text": ["--train-size", "32", "--test-size", "16", "--batch-size", "8", "--chunk-size", "4", "--steps", "2",
             "--max-length", "24", "--warmup", "1", "--lr", "1e-3", "--quiet"],
}


def text_args(model, output_dir, *extra):
    """`gradcache train text` on the tiny BERT folder `model` (the `tiny_bert` fixture)."""
    return ["train", "text", "--model", str(model), *TINY["text"], "--output-dir", str(output_dir), *extra]


@pytest.fixture(autouse=True)
def curves_only_where_asked(request, monkeypatch):
    """A run draws `curves.png` only in a test marked `curves`: matplotlib's layout and PNG take half of a tiny
    run. `draw_curves` has tests of its own (run_folder/test_run_log.py); the smoke test of every mode draws it
    end to end."""
    if request.node.get_closest_marker("curves") is None:
        from gradcache.train.run_folder.log import RunLog

        monkeypatch.setattr(RunLog, "plot", lambda self: None)


@pytest.fixture
def tiny_args():
    def build(mode, output_dir, *extra):
        return ["train", mode, *TINY[mode], "--output-dir", str(output_dir), *extra]

    return build


@pytest.fixture
def killed_after_step(monkeypatch):
    """`killed_after_step(k, argv)`: run `main(argv)` as a job killed right after step k was logged (the
    checkpoint holds an earlier step); it must end with INTERRUPTED, and the log is left as the kill left it."""
    from gradcache.cli import main
    from gradcache.train import errors
    from gradcache.train.run_folder.log import RunLog

    def run(step, argv):
        original = RunLog.log_step

        def crash(self, row):
            original(self, row)
            if row["step"] == step:
                raise KeyboardInterrupt

        monkeypatch.setattr(RunLog, "log_step", crash)
        try:
            assert main(argv) == errors.INTERRUPTED
        finally:
            monkeypatch.setattr(RunLog, "log_step", original)

    return run
