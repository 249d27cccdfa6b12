"""Every list of text formats in help and errors is the `FORMATS` table's: each format's suffixes and folder, in
table order (a format added to the table joins every list)."""
import argparse
from pathlib import Path

import pytest

from gradcache.train.cli import get_args_parser
from gradcache.train.data.resources import reading_data
from gradcache.train.data.text.formats import (
    FORMATS,
    TEXT_LINES,
    described,
    file_suffixes,
    folder_names,
    listed,
    table_suffixes,
)
from gradcache.train.data.text.row_index import build_row_index
from gradcache.train.errors import DataError, DataTooLarge


def test_listed_and_described_name_every_format_in_table_order():
    assert listed(["a"]) == "a" and listed(["a", "b"]) == "a or b" and listed(["a", "b", "c"]) == "a, b or c"
    words = described()
    places = [words.index(suffix) for text_format in FORMATS for suffix in text_format.suffixes]
    assert places == sorted(places) and len(places) == len(file_suffixes())
    assert all(folder in words for folder in folder_names()) and folder_names()  # a datasets folder
    indexed = described(streamed=False)
    assert all((suffix in indexed) != text_format.streamed for text_format in FORMATS
               for suffix in text_format.suffixes if suffix != ".jsonl")  # '.jsonl' is inside '.jsonl.gz'


def _help(path: list[str], flag: str) -> str:
    parser = get_args_parser()
    for name in path:
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = subparsers.choices[name]
    return next(action.help for action in parser._actions if flag in action.option_strings)


@pytest.mark.parametrize("path, flag, formats", [
    (["train", "text"], "--data", listed(file_suffixes())),
    (["train", "text"], "--corpus", described(streamed=False)),
    (["eval"], "--data", described()),  # .parquet and datasets folders included: eval reads what train reads
    (["mine"], "--data", described()),
    (["eval"], "--corpus", listed(table_suffixes())),
    (["encode"], "--data", f"{TEXT_LINES} file (one text per line) or a {listed(table_suffixes())} table"),
])
def test_the_help_lists_the_registry(path, flag, formats):
    assert formats in _help(path, flag)


def test_the_errors_list_the_registry(tmp_path):
    with pytest.raises(DataTooLarge) as raised, reading_data("rows.jsonl"):
        raise MemoryError
    assert f"({listed([*file_suffixes(), *folder_names()])} for text;" in str(raised.value)
    with pytest.raises(DataError, match=f"give {described(streamed=False)}"):
        build_row_index([Path(tmp_path / "rows.xlsx")], ".xlsx")
