"""RUN/model/README.md is a model card: the folder's real path, how to prepare images and switch to evaluation
mode, the run's settings and its final held-out metrics."""
import json

from gradcache.cli import main


def test_the_card_of_a_run_names_its_folder_settings_and_metrics(tmp_path, tiny_args):
    run = tmp_path / "run"
    assert main(tiny_args("simclr", run)) == 0
    card = (run / "model" / "README.md").read_text()
    assert "RUN/model" not in card and f'from_pretrained("{(run / "model").resolve()}")' in card
    assert "model.eval()" in card and "preprocess = transforms.Compose" in card
    assert "| `--batch-size` | 16 |" in card and "| `--strategy` | `gradcache` |" in card
    metrics = json.loads((run / "metrics.json").read_text())
    assert f"| knn_top1 | {metrics['knn_top1']:.2f} |" in card


def test_an_export_elsewhere_names_that_folder(tmp_path, tiny_args):
    run = tmp_path / "run"
    assert main(tiny_args("clip", run)) == 0
    assert main(["export", str(run), "--output", str(tmp_path / "elsewhere")]) == 0
    card = (tmp_path / "elsewhere" / "README.md").read_text()
    assert str((tmp_path / "elsewhere").resolve()) in card and "RUN/model" not in card and "## Training" in card
