"""Pre-emption: SIGTERM or SIGINT stops a run at the end of the step in progress, after a checkpoint.

    with StopSignals() as signals:        # installs the handlers in the main thread, restores them on exit
        run = Run(...)                    # model, checkpoint, step-0 evaluation: a signal stops at once (130)
        signals.defer()                   # training starts: a first signal now waits for the step's end
        for step ...:
            ... run.step(inputs, step, stop_requested=signals.received is not None)  # ranks agree (run.py)
            if agreed stop: run.save(...); raise Preempted(...)          # the program exits PREEMPTED (75)

Before `defer()` nothing is trained and nothing would be worth saving, so a signal raises KeyboardInterrupt
where the program is (building the model, loading the checkpoint, evaluating step 0): the program unwinds and
exits INTERRUPTED (130), as Ctrl-C does before the handlers are installed. After it, the first signal only sets
`received` (and says so on stderr); the loop finishes its step, saves and raises `Preempted`, whose message
names the checkpoint and the command that resumes it. A signal that comes during a save stops the run at the
checkpoint that save writes (the loop asks the ranks once it is written), without training another step. A second signal ends the process at once
(`os._exit(INTERRUPTED)`, 130), wherever it is: no exception that a save's clean-up or a destructor could turn
into a traceback; a save in progress is abandoned, and since a save writes a temporary file and renames it, the
previous checkpoint stays intact.

Schedulers signal the whole process group (SLURM, `kill -TERM -PGID`), so the data loader's workers get the
signal too: `ignore_stop_signals` is their `worker_init_fn`, so they keep feeding the main process, which
decides when to stop and shuts them down. A worker still obeys the SIGTERM of its main process (the loader's and
multiprocessing's way of stopping a worker that does not stop when asked: a worker that ignored it would keep the
interpreter's exit waiting on it for ever), and on Linux it dies with its main process, so none is left behind.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType, TracebackType

from gradcache.train.errors import INTERRUPTED

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Within the block, a SIGTERM/SIGINT before `defer()` raises KeyboardInterrupt (stop at once); after it the
    first sets `received` (the signal's name) and the second ends the process with status INTERRUPTED. Outside
    the main thread (where Python cannot install handlers) it does nothing."""

    def __init__(self) -> None:
        self.received: str | None = None
        self.deferring = False  # True once training started: a first signal waits for the end of its step
        self._previous: dict[int, object] = {}

    def defer(self) -> None:
        """Training starts: from now on a first signal lets the step in progress finish and be saved."""
        self.deferring = True

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if not self.deferring:  # nothing trained yet, nothing to save: unwind from here (the CLI exits 130)
            raise KeyboardInterrupt(f"{name} before training started")
        # os.write, not print: a handler that prints can interrupt a print to the same stream (a reentrant call)
        if self.received is not None:
            os.write(2, f"gradcache train: {name} received a second time; stopped at once without saving (the "
                        f"previous checkpoint, if the run has one, is intact)\n".encode())
            os._exit(INTERRUPTED)
        self.received = name
        os.write(2, f"gradcache train: {name} received; finishing the step in progress, then saving a checkpoint "
                    f"(send it again to stop at once without saving)\n".encode())


def ignore_stop_signals(worker_id: int) -> None:
    """A DataLoader `worker_init_fn`: the worker ignores SIGTERM and SIGINT, except a SIGTERM from its main process,
    which ends it at once; on Linux the worker is killed when its main process dies. A worker whose main process
    ended at once (a second signal) says nothing of the connection it lost."""
    main_process = os.getppid()  # fork and spawn alike: the process that started the worker
    if hasattr(signal, "sigwaitinfo"):  # who sent a signal is known there: the main process's SIGTERM stops it
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # held pending for the thread that waits on them
        threading.Thread(target=_obey_main_process, args=(main_process,), name="stop signals", daemon=True).start()
    else:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
    _die_with(main_process)
    sys.excepthook = _silent_on_lost_connection(sys.excepthook)


def _obey_main_process(main_process: int) -> None:
    """Wait for the blocked stop signals; end the worker on one that its main process sent, drop the others."""
    while True:
        if signal.sigwaitinfo(STOP_SIGNALS).si_pid == main_process:
            # Status 0: torch's loader takes a worker's non-zero exit for a failure, and its main process stops
            # a worker this way only once it no longer needs it.
            os._exit(0)


def _die_with(main_process: int) -> None:
    """Linux: SIGKILL to this process when `main_process` dies (PR_SET_PDEATHSIG), and exit now if it already
    did; elsewhere nothing (the loader's workers notice a dead main process within seconds when idle)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (AttributeError, OSError):  # no prctl in this C library
        return
    if os.getppid() != main_process:  # it died before the request took effect
        os._exit(0)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _silent_on_lost_connection(hook):
    def excepthook(kind, value, traceback):  # multiprocessing's resource sharer reports through sys.excepthook
        if not issubclass(kind, ConnectionError):
            hook(kind, value, traceback)

    return excepthook
