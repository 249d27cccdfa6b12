"""What a run leaves in its output folder besides checkpoints: the lock that gives the folder to one job
(`lock.py`), the logs, metrics and curves (`log.py`), and the permissions of the files it writes
(`permissions.py`).
May import: the standard library, matplotlib, `gradcache.train.errors`."""
