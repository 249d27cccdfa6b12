"""`--report-to wandb`: an offline W&B run in RUN/wandb/, no account, no network, holding every train_log.csv
column as train/<column> and every eval_log.csv metric as eval/<metric> at the CSV's steps (read back from the
run's `.wandb` file, a LevelDB-style log of W&B's protobuf records); a resumed job logs to the same run id."""
import csv
import json
import math
import struct
import time

import pytest

pytest.importorskip("wandb", reason="the wandb extra: pip install 'gradcache[wandb]'")
from wandb.proto import wandb_internal_pb2

from gradcache.cli import main

BLOCK, HEADER = 32768, 7  # the log's block size; its file header and each record's header are 7 bytes
FULL, LAST = 1, 4  # record types: a whole record, the last fragment of one


def _records(path):
    """The protobuf records of a `.wandb` file."""
    data, position, fragments = path.read_bytes(), HEADER, b""
    while position + HEADER <= len(data):
        left = BLOCK - position % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + HEADER])
        if kind == 0:  # zero padding to the end of the block
            position += left
            continue
        fragments += data[position + HEADER:position + HEADER + length]
        position += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(fragments)
            fragments = b""
            yield record


def _history(run_file) -> dict[int, dict[str, float]]:
    """step -> {tag: value} of the W&B run's history (W&B's own `_step`, `_runtime`, ... left out)."""
    rows: dict[int, dict[str, float]] = {}
    for record in _records(run_file):
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            rows.setdefault(int(items["_step"]), {}).update({k: v for k, v in items.items() if not k.startswith("_")})
    return rows


def _csv_rows(folder) -> dict[int, dict[str, float]]:
    """step -> {tag: value}, what the CSV logs say W&B must hold."""
    rows: dict[int, dict[str, float]] = {}
    for prefix, name in (("train", "train_log.csv"), ("eval", "eval_log.csv")):
        with open(folder / name, newline="") as handle:
            for row in csv.DictReader(handle):
                rows.setdefault(int(row["step"]), {}).update(
                    {f"{prefix}/{column}": float(cell) for column, cell in row.items() if column != "step" and cell})
    return rows


def _assert_equal(written: dict[int, dict[str, float]], expected: dict[int, dict[str, float]]) -> None:
    assert written.keys() == expected.keys()
    for step, values in expected.items():
        assert written[step].keys() == values.keys(), step
        for tag, value in values.items():
            assert written[step][tag] == value or math.isnan(value) and math.isnan(written[step][tag]), (step, tag)


@pytest.mark.slow
def test_an_offline_run_holds_the_csv_logs_and_a_resume_continues_its_id(tmp_path, tiny_args, killed_after_step,
                                                                       monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline by default
    monkeypatch.setenv("WANDB_DISABLE_CODE", "true")
    folder = tmp_path / "run"
    killed_after_step(3, tiny_args("simclr", folder, "--steps", "5", "--checkpoint-every", "2", "--eval-every", "2",
                                   "--report-to", "wandb"))  # steps 1-3 logged, the checkpoint at step 2
    time.sleep(1)  # W&B names an offline run's folder by the second it started: one folder per job
    assert main(tiny_args("simclr", folder, "--steps", "5", "--resume", str(folder))) == 0  # --report-to kept
    run_id = (folder / "wandb" / "run_id").read_text().strip()
    killed, resumed = sorted((folder / "wandb").glob("offline-run-*"))  # offline: no account, no network
    assert killed.name.endswith(run_id) and resumed.name.endswith(run_id)
    expected = _csv_rows(folder)
    _assert_equal({step: row for step, row in _history(killed / f"run-{run_id}.wandb").items() if step <= 2},
                  {step: row for step, row in expected.items() if step <= 2})
    _assert_equal(_history(resumed / f"run-{run_id}.wandb"), {step: row for step, row in expected.items() if step > 2})
