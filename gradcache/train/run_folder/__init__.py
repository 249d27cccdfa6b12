"""What a run leaves in its output folder besides checkpoints: the names that mark a folder as a run's
(`layout.py`), the lock that gives the folder to one job (`lock.py`), the logs, metrics and curves (`log.py`), the permissions of the files it writes (`permissions.py`)
and, with `--report-to`, the same rows for TensorBoard or Weights & Biases (`reporters.py`, `tensorboard.py`,
`weights_and_biases.py`).
May import: the standard library, matplotlib, `gradcache.train.errors`, the checkpoint kinds' names
(`gradcache.train.checkpoints`, in `layout.py`); tensorboard (through
`torch.utils.tensorboard`) and wandb only when a run asks for them."""
