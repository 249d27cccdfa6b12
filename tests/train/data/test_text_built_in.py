import re

import pytest

from gradcache.train.data.text.built_in import (
    PASTIMES,
    PROFESSIONS,
    RELATIVES,
    TOWNS,
    generate_world,
)


def _attributes(passage):
    """(town, profession, pastime) stated by a passage, read back with the world's vocabulary."""
    town = [t for t in TOWNS if re.search(rf"\b{t}\b", passage)]
    profession = [p for p in PROFESSIONS if re.search(rf"\b(a|an) {p}\b", passage)]
    pastime = [h for h in PASTIMES if h in passage]
    assert len(town) == len(profession) == len(pastime) == 1, passage
    return town[0], profession[0], pastime[0]


def _described(query):
    """The (town, profession, pastime) a query describes, from the paraphrases it uses."""
    town = [t for t in TOWNS if t in query]
    profession = [p for p, phrases in PROFESSIONS.items() if any(phrase in query for phrase in phrases)]
    pastime = [h for h, phrases in PASTIMES.items() if any(phrase in query for phrase in phrases)]
    assert len(town) == len(profession) == len(pastime) == 1, query
    return town[0], profession[0], pastime[0]


def test_each_query_describes_its_positive_and_no_negative():
    pairs = generate_world(rows=300, negatives_per_query=2, seed=3)
    assert len(pairs) == 300 and pairs.negatives_per_query == 2
    answers = {}
    for query, positive, negatives in zip(pairs.queries, pairs.positives, pairs.negatives):
        wanted = _described(query)
        assert _attributes(positive) == wanted
        for negative in negatives:
            differs = [a != b for a, b in zip(_attributes(negative), wanted)]
            assert sum(differs) == 1, (query, negative)  # hard: two of the three attributes shared
        answers[wanted] = positive
    every = [_attributes(p) for p in pairs.positives] + [_attributes(n) for row in pairs.negatives for n in row]
    assert len(set(every)) == len(every), "no passage of the world answers another's query"


def test_deterministic_given_the_seed_and_without_negatives():
    assert generate_world(50, 1, seed=0) == generate_world(50, 1, seed=0)
    assert generate_world(50, 1, seed=0).queries != generate_world(50, 1, seed=1).queries
    assert generate_world(20, 0).negatives == [[]] * 20


def test_bad_sizes():
    with pytest.raises(ValueError, match="rows=100000"):
        generate_world(100000)
    with pytest.raises(ValueError, match="negatives_per_query=-1"):
        generate_world(10, -1)


def _mentions(passage):
    """How many towns, professions and pastimes a passage names."""
    return (sum(bool(re.search(rf"\b{t}\b", passage)) for t in TOWNS),
            sum(bool(re.search(rf"\b(a|an) {p}\b", passage)) for p in PROFESSIONS),
            sum(h in passage for h in PASTIMES))


def test_the_hard_world_adds_a_relative_with_two_attributes_to_every_passage():
    plain, hard = generate_world(200, 1, seed=4), generate_world(200, 1, seed=4, hard=True)
    assert len(hard) == 200 and hard.negatives_per_query == 1
    assert hard == generate_world(200, 1, seed=4, hard=True) and hard != generate_world(200, 1, seed=5, hard=True)
    assert plain == generate_world(200, 1, seed=4)  # the default world is drawn as before
    for query, positive, negatives in zip(hard.queries, hard.positives, hard.negatives):
        wanted = _described(query)
        for passage in (positive, *negatives):
            counts = _mentions(passage)
            # the resident's three attributes plus the relative's two (a repeat of the same word counts once)
            assert sorted(counts)[0] >= 1 and sum(counts) <= 5 and max(counts) <= 2, passage
        assert all(re.search(rf"\b{word}\b", positive) for word in (wanted[0], wanted[1], wanted[2])), positive
    stated = [_resident(p) for p in hard.positives] + [_resident(n) for row in hard.negatives for n in row]
    assert len(set(stated)) == len(stated), "each (town, profession, pastime) belongs to one passage's resident"
    assert sum(map(len, hard.positives)) > 1.3 * sum(map(len, plain.positives))  # a sentence more per passage


def _resident(passage):
    """The resident's (town, profession, pastime) of a hard passage: its sentences without the relative's."""
    relative = re.compile(r"(His|Her) (" + "|".join(RELATIVES) + r")\b[^.]*\.")
    return _attributes(relative.sub("", passage))

