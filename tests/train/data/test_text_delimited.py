"""A `.csv`/`.tsv` quote that never closes where a field ends swallows the rows after it into one field: refused
(exit 2), naming the file and the line where the quote opens; a quoted field that spans lines and closes where a
field ends stays one field."""
import pytest

from gradcache.train.data.text.row_index import build_row_index
from gradcache.train.errors import DataError, exit_status_of

ROWS = 60


def _table(tmp_path, opened_at, closed_at=None, separator=","):
    """A table of ROWS rows whose row `opened_at` opens a quote that row `closed_at` (None: none) closes
    mid-field."""
    lines = ["query,positive".replace(",", separator)]
    for i in range(1, ROWS + 1):
        positive = f'"p{i}' if i == opened_at else f'say "hi" {i}' if i == closed_at else f"p{i}"
        lines.append(f"q{i}{separator}{positive}")
    path = tmp_path / ("pairs.csv" if separator == "," else "pairs.tsv")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("closed_at, separator", [(ROWS, ","), (None, ","), (ROWS, "\t")])
def test_an_unmatched_quote_that_swallows_rows_is_refused_naming_its_line(tmp_path, closed_at, separator):
    path = _table(tmp_path, opened_at=12, closed_at=closed_at, separator=separator)
    with pytest.raises(DataError) as caught:
        build_row_index([path], path.suffix, warn=False)
    message = str(caught.value)
    assert str(path) in message and "line 13" in message and "quote" in message  # the header is line 1
    assert exit_status_of(caught.value) == 2


def test_a_quoted_field_over_several_lines_that_closes_is_kept(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text('query,positive\nq1,"first line\nq2,looks like a row\nlast line"\nq3,p3\n', encoding="utf-8")
    index = build_row_index([path], ".csv", warn=False)
    assert [index.row(i) for i in range(len(index))] == [("q1", "first line\nq2,looks like a row\nlast line", []),
                                                         ("q3", "p3", [])]
