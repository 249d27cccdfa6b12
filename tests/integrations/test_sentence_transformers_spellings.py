"""The one rule for an option spelled two ways (this library's and sentence-transformers'), and its one wording."""
import math

import pytest

from gradcache.integrations.sentence_transformers.spellings import PeerSpellings, count_of, temperature_of


@pytest.mark.parametrize("temperature, scale, want", [
    (None, None, 0.1), (0.05, None, 0.05), (None, 20.0, 0.05), (0.05, 20.0, 0.05), (0.5, 2, 0.5), (None, 3.0, 1 / 3),
])
def test_temperature_from_either_spelling_or_both(temperature, scale, want):
    assert math.isclose(temperature_of("Loss", temperature, scale, 0.1), want, rel_tol=1e-12)


def test_no_temperature_and_no_default_is_none():
    assert temperature_of("Loss", None, None, None) is None


@pytest.mark.parametrize("value, peer, want", [(None, None, 32), (4, None, 4), (None, 4, 4), (4, 4, 4)])
def test_count_from_either_spelling_or_both(value, peer, want):
    assert count_of("Loss", "chunk_size", value, "mini_batch_size", peer, 32) == want


@pytest.mark.parametrize("temperature, scale, match", [
    (0.5, 3.0, r"^Loss got temperature=0\.5 and scale=3\.0, which disagree \(scale = 1 / temperature = 2\.0\)"),
    (0.0, None, r"^Loss got temperature=0\.0; temperature must be a finite number > 0"),
    (None, -1.0, r"^Loss got scale=-1\.0; scale must be a finite number > 0"),
    (None, math.inf, r"^Loss got scale=inf; scale must be a finite number > 0"),
    (math.nan, None, r"^Loss got temperature=nan; temperature must be a finite number > 0"),
    (True, None, r"^Loss got temperature=True; temperature must be a finite number > 0"),
    ("0.5", None, r"^Loss got temperature='0\.5'; temperature must be a finite number > 0"),
])
def test_bad_or_disagreeing_temperatures_are_refused_by_name_and_value(temperature, scale, match):
    with pytest.raises(ValueError, match=match):
        temperature_of("Loss", temperature, scale, 1.0)


@pytest.mark.parametrize("value, peer, error, match", [
    (4, 8, ValueError, r"^Loss got chunk_size=4 and mini_batch_size=8, which disagree \(mini_batch_size is "
                       r"sentence-transformers' name for chunk_size\)"),
    (0, None, ValueError, r"^Loss got chunk_size=0; chunk_size must be an int >= 1"),
    (None, -2, ValueError, r"^Loss got mini_batch_size=-2; mini_batch_size must be an int >= 1"),
    (2.5, None, TypeError, r"^Loss got chunk_size=2\.5; chunk_size must be an int >= 1"),
    (None, True, TypeError, r"^Loss got mini_batch_size=True; mini_batch_size must be an int >= 1"),
])
def test_bad_or_disagreeing_counts_are_refused_by_name_and_value(value, peer, error, match):
    with pytest.raises(error, match=match):
        count_of("Loss", "chunk_size", value, "mini_batch_size", peer, 32)


def test_the_peers_names_read_this_librarys_values():
    class Loss(PeerSpellings):
        def __init__(self) -> None:
            self.loss = type("Inner", (), {"temperature": 0.25})()
            self.chunk_size = 6

    loss = Loss()
    assert (loss.temperature, loss.scale, loss.mini_batch_size) == (0.25, 4.0, 6)
