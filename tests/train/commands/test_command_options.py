"""The options of encode, eval and mine are declared once (commands/command_options.py): each range is checked
before MODEL is read, with one message per option whatever the command, and the fields shared with training take
`RunConfig`'s defaults and ranges."""
import dataclasses

import pytest

from gradcache.cli import main
from gradcache.train.commands.command_options import ENCODE_OPTIONS, EVAL_OPTIONS, MINE_OPTIONS
from gradcache.train.config import RunConfig

REQUIRED = {"encode": ["--data", "texts.txt", "--output", "out.npy"], "eval": [],
            "mine": ["--data", "pairs.jsonl", "--output", "mined.jsonl", "--negatives", "1"]}


@pytest.mark.parametrize("command", sorted(REQUIRED))
@pytest.mark.parametrize("option, value, message", [
    ("--batch-size", "0", "--batch-size must be at least 1, got 0"),
    ("--max-length", "1", "--max-length must be at least 2 (two special tokens), got 1"),
])
def test_a_range_is_checked_before_the_model_is_read(command, option, value, message, capsys):
    argv = [command, "no-such-model", *REQUIRED[command], option, value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "no such file" not in err


@pytest.mark.parametrize("groups", [ENCODE_OPTIONS, EVAL_OPTIONS, MINE_OPTIONS])
def test_the_options_shared_with_training_take_its_defaults(groups):
    shared = {"device", "query_key", "positive_key", "pooling", "query_prompt", "passage_prompt"}
    for group in groups:
        for field in dataclasses.fields(group):
            if field.name in shared:
                assert field.default == RunConfig.__dataclass_fields__[field.name].default, field.name
