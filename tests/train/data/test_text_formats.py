"""A text format is one module and one line of `FORMATS`: a stand-in `.jsonl.zst` (zlib standing in for
zstandard's codec, which may not be installed), registered by the test, trains a step through
`gradcache train text`; the table tells formats by their longest suffix, case aside."""
import io
import json
import zlib
from pathlib import Path

import pytest

from gradcache.cli import main
from gradcache.train import errors
from gradcache.train.data.text import formats
from gradcache.train.data.text.files import data_files
from gradcache.train.data.text.formats.text_format import StreamedFormat
from tests.train.conftest import text_args


class JsonlZst(StreamedFormat):
    """The toy format's module: JSON lines through a codec (zlib's, standing in for zstandard's)."""

    name = ".jsonl.zst"
    suffixes = (".jsonl.zst",)
    read_errors = (OSError, EOFError, zlib.error)
    decompress_command = "unzstd"

    def open(self, path):
        return io.BytesIO(zlib.decompress(Path(path).read_bytes()))


JSONL_ZST = JsonlZst()


def test_a_format_of_one_module_and_one_registry_line_trains(tmp_path, tiny_bert, monkeypatch):
    pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
    monkeypatch.setattr(formats, "FORMATS", [*formats.FORMATS, JSONL_ZST])  # the registry line
    rows = [{"query": f"who is number {i}?", "positive": f"{i} is a number"} for i in range(48)]
    data = tmp_path / "pairs.jsonl.zst"
    data.write_bytes(zlib.compress("".join(json.dumps(row) + "\n" for row in rows).encode()))
    assert data_files(data) == ([data], ".jsonl.zst")
    run = tmp_path / "run"
    assert main(text_args(tiny_bert, run, "--data", str(data), "--steps", "1")) == errors.OK
    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["train_size"], metrics["test_size"], metrics["skipped_rows"]) == (32, 16, 0)


def test_the_table_tells_a_file_by_its_longest_suffix(tmp_path):
    assert formats.file_format("a/b.JSONL.GZ") is formats.JSONL_GZ
    assert formats.file_format("b.jsonl") is formats.JSONL
    assert formats.file_format("b.gz") is None
    assert formats.folder_format(tmp_path) is None
    assert formats.format_named(".tsv").separator == "\t"
    assert formats.file_suffixes() == [".jsonl.gz", ".jsonl", ".tsv", ".csv", ".parquet"]
