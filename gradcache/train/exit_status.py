"""The exit statuses of `gradcache train` and `gradcache eval`, for schedulers and scripts to act on."""
from __future__ import annotations

DONE = 0
USAGE = 2  # a bad option, unusable data or checkpoint, a run folder in use: fix the command; nothing was written
DIVERGED = 3
DATA_ERROR = 4
COLLECTIVE_TIMEOUT = 5  # a collective failed or timed out (a rank died or froze): torchrun --max-restarts retries
DISK_FULL = 74  # (sysexits EX_IOERR) a save ran out of space; the previous checkpoint is kept: free space, resume
PREEMPTED = 75  # (sysexits EX_TEMPFAIL) stopped by a signal after saving: requeue with --resume
