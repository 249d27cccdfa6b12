"""curves.png reads at a glance: a colour per metric, the chance levels as one labelled band, the legend
outside the data."""
import math

import matplotlib.pyplot as plt
from matplotlib.colors import to_hex

from gradcache.train.run_folder.log import draw_curves


def test_clip_curves_have_distinct_colours_one_chance_band_and_the_legend_outside():
    scores = [f"{d}_recall@{k}" for k in (1, 5, 10) for d in ("image_to_text", "text_to_image")] + ["zero_shot_top1"]
    chance = ["chance_" + key for key in scores[:6]]
    evals = [{"step": s, **{k: 10.0 + s + i for i, k in enumerate(scores)},
              **{k: 0.1 * (i + 1) for i, k in enumerate(chance)}} for s in (0, 5, 10)]
    train = [{"step": s, "loss": 1 / s} for s in range(1, 11)]
    figure = draw_curves(train, evals)
    try:
        axis = figure.axes[1]
        lines = axis.get_lines()
        assert [line.get_label() for line in lines] == scores  # no line per chance level
        assert len({to_hex(line.get_color()) for line in lines}) == len(scores)
        bands = [patch for patch in axis.patches if "chance" in patch.get_label()]
        assert len(bands) == 1 and "0.1 to 0.6" in bands[0].get_label()
        figure.canvas.draw()
        legend = axis.get_legend().get_window_extent()
        assert legend.x0 >= axis.get_window_extent().x1  # right of the data, covering none of it
    finally:
        plt.close(figure)


def test_simclr_curves_without_chance_levels():
    figure = draw_curves([{"step": 1, "loss": 2.0}], [{"step": 0, "knn_top1": 20.0}, {"step": 1, "knn_top1": math.nan}])
    try:
        assert [line.get_label() for line in figure.axes[1].get_lines()] == ["knn_top1"]
        assert not figure.axes[1].patches
    finally:
        plt.close(figure)


def test_resuming_a_log_written_before_the_skipped_column_keeps_its_rows_aligned(tmp_path):
    import csv

    from gradcache.train.run_folder.log import TRAIN_COLUMNS, RunLog

    old = [c for c in TRAIN_COLUMNS if c != "skipped"]
    with open(tmp_path / "train_log.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(old)
        writer.writerows([[step, 0, 3.0 - step, 0.1, 9.0, 30, 0.1, step] for step in (1, 2, 3)])
    log = RunLog(tmp_path, resume_step=2)
    log.log_step({"step": 3, "epoch": 0, "loss": "2.5", "skipped": 1})
    with open(tmp_path / "train_log.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["step"] for row in rows] == ["1", "2", "3"] and [row["loss"] for row in rows] == ["2.0", "1.0", "2.5"]
    assert [row["skipped"] for row in rows] == ["", "", "1"] and log.skipped_steps() == 1
