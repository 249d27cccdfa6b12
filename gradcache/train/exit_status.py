"""The exit statuses of `gradcache`, so that a scheduler (or a script) can tell what happened and what to do.

    status  name                what happened                                           what to do next
    0       OK                  the command finished                                    nothing
    1       (none)              a bug: an uncaught error, with its traceback            report it
    2       USAGE               a bad option or value, unusable data, a bad checkpoint, fix the command; nothing
                                an output folder that holds another run or job          was trained or written
    3       DIVERGED            the loss, the embeddings, the gradients or the weights  lower --lr, raise --warmup
                                became NaN or infinite; the last good checkpoint is     (or bf16 for fp16), resume
                                kept and no non-finite one is written                   or start afresh
    4       DATA_ERROR          more of the data than --max-bad-share is unreadable     repair the data
    5       COLLECTIVE_TIMEOUT  a peer rank did not answer a collective in time         resume (a restart does)
    75      PREEMPTED           SIGTERM or SIGINT: the step in progress finished and    requeue: `gradcache train
                                a checkpoint was saved (75 is EX_TEMPFAIL, "try         MODE --resume FOLDER`
                                again later", which requeue hooks understand)
    130     INTERRUPTED         a second SIGTERM/SIGINT, or Ctrl-C before training      resume from the previous
                                started: stopped at once without saving (128 + SIGINT,  checkpoint, which is intact
                                the shell's convention)

Under `torchrun`, every worker exits with its own status and torchrun reports its own to the scheduler: torchrun
treats any non-zero worker status as a failure and, with `--max-restarts` > 0, restarts the whole group. When
the scheduler signals torchrun (or the whole process group, as SLURM does), torchrun forwards the signal, waits
`--shutdown-timeout` seconds (30 by default) for the workers to save and exit, and stops without restarting,
whatever their status. A SIGTERM sent to the workers alone (not to torchrun) makes them save and exit PREEMPTED,
which torchrun counts as a failure: with `--max-restarts` > 0 and `--resume auto` the group restarts from the
checkpoint just saved; with `--max-restarts 0` the job ends there, resumable.
"""
from __future__ import annotations

OK = 0
USAGE = 2
DIVERGED = 3
DATA_ERROR = 4
COLLECTIVE_TIMEOUT = 5
PREEMPTED = 75  # EX_TEMPFAIL of sysexits.h
INTERRUPTED = 130  # 128 + SIGINT
