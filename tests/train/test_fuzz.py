"""Property-based fuzz, seeded and bounded (Hypothesis): the text readers and the option checks meet arbitrary
input and either accept it or refuse it with an error that carries a documented exit status
(gradcache/train/errors.py); anything else would end a run in a traceback."""
from __future__ import annotations

import argparse
import gzip
import warnings

import pytest

hypothesis = pytest.importorskip("hypothesis", reason='the dev extra installs it: pip install -e ".[dev]"')
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from gradcache.train import errors  # noqa: E402

FUZZ = settings(max_examples=60, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# What text files are made of, and what breaks their parsers: quotes, separators, brackets, line ends, bytes that
# are not UTF-8, NUL, the column names, numbers and nulls.
PIECES = [b'"', b",", b"\t", b"\n", b"\r\n", b"{", b"}", b"[", b"]", b":", b'"query"', b'"positive"', b"query",
          b"positive", b"\xff", b"\xc3", b"\x00", b"a b", b"1", b"-2.5e9", b"null", b"true", b"\\", b"'", b"\xef\xbb\xbf"]
GOOD_LINES = [b'{"query": "a b", "positive": "c d"}\n', b"a b,c d\n", b"a b\tc d\n"]
LINE = st.one_of(st.sampled_from(GOOD_LINES), st.lists(st.sampled_from(PIECES), max_size=12).map(b"".join))
HEADER = st.sampled_from([b"", b"query,positive\n", b"query\tpositive\n"])
CONTENT = st.tuples(HEADER, st.lists(LINE, max_size=12)).map(lambda parts: parts[0] + b"".join(parts[1]))
SUFFIXES = [".jsonl", ".csv", ".tsv", ".jsonl.gz"]


def _documented(error: BaseException) -> bool:
    return errors.exit_status_of(error) is not None


@pytest.mark.slow
@FUZZ
@given(content=CONTENT, suffix=st.sampled_from(SUFFIXES), compressed=st.booleans())
def test_text_readers_accept_or_refuse_with_a_status(tmp_path_factory, content, suffix, compressed):
    from gradcache.train.data.text.sources import read_text_pairs

    path = tmp_path_factory.mktemp("fuzz") / f"pairs{suffix}"
    path.write_bytes(gzip.compress(content) if suffix.endswith(".gz") and compressed else content)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            pairs = read_text_pairs(path, "query", "positive")
        except Exception as error:  # noqa: BLE001 - the property: every refusal carries a status
            assert _documented(error), f"{type(error).__name__}: {error} for {content!r}"
            return
    assert len(pairs.queries) == len(pairs.positives) > 0
    assert all(isinstance(q, str) and q for q in pairs.queries)


def _numeric_options(parser: argparse.ArgumentParser) -> list[str]:
    """The long options of `parser` that take one value (numbers, names, paths)."""
    return sorted(action.option_strings[-1] for action in parser._actions
                  if action.option_strings and action.nargs is None and action.type in (int, float)
                  and action.option_strings[-1].startswith("--"))


VALUES = st.sampled_from(["0", "-1", "1", "2", "3", "7", "1e309", "-1e309", "nan", "inf", "0.5", "-0.0", "1e-320",
                          "99999999999999999999", "2.5", "abc", "", "1_000", "0x10", " 4"])


@pytest.fixture(scope="module")
def simclr_parser():
    from gradcache.train.modes import MODES
    from gradcache.train.train_options import add_train_options

    parser = argparse.ArgumentParser(exit_on_error=False, allow_abbrev=False)
    add_train_options(parser, MODES["simclr"])
    return parser


TINY_SIMCLR = ["--train-size", "64", "--test-size", "32", "--image-size", "16", "--batch-size", "16",
               "--chunk-size", "8", "--width", "8", "--hidden-dim", "32", "--projection-dim", "16", "--steps", "2",
               "--workers", "0"]


@FUZZ
@given(data=st.data())
def test_option_checks_accept_or_refuse_with_a_status(simclr_parser, data):
    from gradcache.train.preflight import check_options
    from gradcache.train.train_options import config_from_args

    flags = data.draw(st.lists(st.sampled_from(_numeric_options(simclr_parser)), min_size=1, max_size=4,
                               unique=True))
    argv = [*TINY_SIMCLR]
    for flag in flags:
        argv += [f"{flag}={data.draw(VALUES)}"]
    try:
        args = simclr_parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit):  # argparse's own refusal: exit 2 through main
        return
    args.mode = "simclr"
    config = config_from_args(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            check_options(config)
        except Exception as error:  # noqa: BLE001 - the property: every refusal carries a status
            assert errors.exit_status_of(error) == errors.USAGE, f"{type(error).__name__}: {error} for {argv}"
            assert any(flag in str(error) or flag.replace("-", "_")[2:] in str(error) for flag in flags) \
                or "--" in str(error), str(error)
