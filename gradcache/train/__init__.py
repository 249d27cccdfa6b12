"""The training program behind `gradcache train`, `eval`, `export`, `encode` and `mine` (docs/training.md says
how to use it; README.md beside this file says where things live and where to add a mode, a format or a loss).

At the top: the `gradcache` command line (`cli.py`; what a command writes on stdout and stderr: `command_output.py`;
the installed torch and torchvision it checks first: `installation.py`), the run's configuration (`config.py`), the
options of `gradcache train <mode>` (`train_options.py`), the checks before a run writes anything (`preflight.py`),
what a run is made of and does per step (`run.py`), the loop (`loop.py`), pre-emption (`preemption.py`),
`--strategy` and `--precision` (`strategy_choice.py`), `--matryoshka-dims` (`matryoshka_dims.py`) and every error
with its exit status (`errors.py`). Sub-packages, one concept each: `modes/` (what differs between SimCLR, CLIP and
text), `data/`, `checkpoints/`, `eval/`, `optim/`, `parallel/`, `run_folder/`, `export/` (a run's model in the
formats its users load) and `commands/` (encode, eval on any data, mine). Arrows point down: a sub-package never
imports the loop, the run or the command line; the library (`gradcache`) never imports this package
(`gradcache/cli.py` and `gradcache/__main__.py`, the command's entry points, are not the library: they import
`cli.py` here).
"""
