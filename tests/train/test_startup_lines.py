"""What a run says on stderr while it prepares (progress.py's `startup_phase`), warnings as one line
(command_output.py's `one_line_warnings`), transformers' messages once (models/huggingface_folder.py), and no
FutureWarning from the program's own calls into transformers."""
import io
import json
import logging
import warnings

import pytest
import torch

from gradcache.cli import main
from gradcache.train.command_output import one_line_warnings
from gradcache.train.config import RunConfig
from gradcache.train.modes import TEXT_KINDS
from gradcache.train.modes.assembly import build_model
from gradcache.train.progress import startup_phase


def test_a_phase_is_one_line_unless_silenced():
    stream = io.StringIO()
    startup_phase("text", "loading the model (--model m)", True, stream)
    startup_phase("text", "never shown", False, stream)
    assert stream.getvalue() == "gradcache train text: loading the model (--model m)\n"


def test_a_warning_is_one_line_without_its_source_line():
    """As Python's own showwarning prints it (pytest's recorder replaces showwarning, not the format)."""
    original = warnings.formatwarning
    with one_line_warnings():
        shown = [warnings.formatwarning("a column is unused", UserWarning, "gradcache/x.py", 3, "    source line"),
                 warnings.formatwarning("an old call", FutureWarning, "gradcache/y.py", 9, None)]
    assert shown == ["gradcache: warning: a column is unused\n", "gradcache: FutureWarning: an old call\n"]
    assert warnings.formatwarning is original


def test_transformers_says_each_message_once():
    pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')
    import transformers

    from gradcache.models.huggingface_folder import quiet_transformers

    quiet_transformers()
    quiet_transformers()  # each load calls it: one filter still
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    for existing in transformers.utils.logging.get_logger().handlers:
        for each in existing.filters:
            handler.addFilter(each)
    logger = transformers.utils.logging.get_logger("transformers.modeling_utils")
    logger.addHandler(handler)
    try:
        for _ in range(2):
            logger.warning("LlamaModel LOAD REPORT from: /a/folder (a test's own)")
        logger.warning("another message (a test's own)")
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue().splitlines() == ["LlamaModel LOAD REPORT from: /a/folder (a test's own)",
                                              "another message (a test's own)"]
    assert all(len([f for f in h.filters if type(f).__name__ == "_FirstTime"]) == 1
               for h in transformers.utils.logging.get_logger().handlers)


@pytest.mark.slow  # writing the decoder imports deepspeed (transformers' save_pretrained): seconds
def test_no_future_warning_from_the_programs_checkpointing_and_lora(tmp_path):
    pytest.importorskip("peft", reason='pip install -e ".[lora]"')
    from tests.tiny_decoder_model import write_tiny_decoder

    folder = write_tiny_decoder(tmp_path / "llama")
    config = RunConfig(mode="text", model=str(folder), pooling="last", lora_rank=2, grad_checkpointing=True,
                       max_length=16)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*is_gradient_checkpointing", category=FutureWarning)
        model = build_model(TEXT_KINDS["dense"], config).train()
        tokens = {"input_ids": torch.tensor([[2, 5, 6, 3]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
        model.encode_query(**tokens).sum().backward()


@pytest.mark.slow  # a whole run
def test_a_run_says_each_start_up_phase_before_its_first_step(tmp_path, tiny_args, capsys):
    argv = [token for token in tiny_args("simclr", tmp_path / "run") if token != "--quiet"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    phases = ["gradcache train simclr: reading the data (--data shapes)",
              "gradcache train simclr: loading the model (--model convnet)",
              "gradcache train simclr: evaluating step 0 on 32 held-out images", "gradcache train simclr: step 1/2"]
    places = [err.find(line) for line in phases]
    assert -1 not in places and places == sorted(places), err
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["steps"] == 2
