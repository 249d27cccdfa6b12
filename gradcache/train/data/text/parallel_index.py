"""Large `.jsonl` files indexed in P forked processes, a byte range each: the index of the serial pass, sooner.

`build_row_index` (row_index.py) takes this path for `.jsonl` files of at least PARALLEL_BYTES together when
P = min(usable cores, MAX_PROCESSES) > 1 and the start method "fork" exists (spawn would re-import torch, 10 s).
Only JSONL: a CSV record may span lines, so a table cannot be cut at any newline. h is decided first, in the
parent, from the head of the files; then:

- `byte_ranges`: each file is cut into pieces in proportion to its size (a small file whole, so a range never
  spans two files), each cut just after a newline (a range never cuts a line); about P ranges in all.
- A first map counts the newlines of every range, so that each range knows the line number of its first line
  and its skip reasons and errors name the lines the serial pass names.
- Each range is indexed by the task, inherited by fork with everything it holds (a `--corpus` is not pickled);
  only the ranges and the results (int64 offsets, skip counts and reasons) cross between processes. Results come
  back in file order; the first range that fails, in file order, raises its error, so the first bad line wins.
- Processes: at most P, each given a contiguous run of ranges (`in_processes`), its results sent back through a
  pipe. A process that dies without sending them (the kernel's out-of-memory killer, a signal) is noticed when
  its pipe closes: MemoryError, which the run reports as exit 4 (data/resources.py), never a wait forever (a
  `multiprocessing.Pool` waits forever for the task of a worker that was killed).
- Signals: a Ctrl-C reaches the whole foreground process group. The workers ignore SIGINT and the parent alone
  decides: its KeyboardInterrupt terminates the workers (SIGTERM, which they take at its default: the parent's
  StopSignals handler, inherited by fork, would raise KeyboardInterrupt in each worker and print its traceback).
  No worker outlives the parent's pass. Unlike the data loader's workers (`preemption.ignore_stop_signals`),
  nothing is trained yet, so there is no step to finish first.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from gradcache.train.launch_environment import launch_variable

# Below this the forks and the extra pass that numbers the lines cost a good part of what P processes save:
# 64 MB of JSONL is about 100k rows, 0.4 s on one core.
PARALLEL_BYTES = 64 * 2**20
MAX_PROCESSES = 8  # the parent merges the results alone, and a run's ranks each index the same files
_BLOCK = 2**20  # bytes read at a time when counting newlines


class LineRange(NamedTuple):
    """Whole lines of one file: bytes [start, end), the first of them line `first_line` of the file."""

    file_number: int
    path: str
    start: int
    end: int
    first_line: int = 1


def parallel_processes(files: Sequence[Path]) -> int:
    """P, the processes to index `files` with, or 1 for the serial pass: small files, one core, or no fork."""
    if "fork" not in multiprocessing.get_all_start_methods() or multiprocessing.current_process().daemon:
        return 1  # a daemonic process (a pool's worker) may not start processes
    try:
        if sum(os.path.getsize(file) for file in files) < PARALLEL_BYTES:
            return 1
    except OSError:
        return 1  # the serial pass reports the file it cannot read where it meets it
    return min(usable_cores(), MAX_PROCESSES)


def usable_cores() -> int:
    """The cores this process may run on (a scheduler's or a container's allocation), not the machine's, shared
    with the other ranks torchrun started on this node (LOCAL_WORLD_SIZE): they index the same files at once."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(cores // launch_variable("LOCAL_WORLD_SIZE"), 1)


def byte_ranges(files: Sequence[Path], parts: int) -> list[LineRange]:
    """About `parts` ranges of about equal size: each file cut in proportion to its size (a file under a part's
    size whole), each cut just after a newline, in file order. A file that cannot be opened is one range, whose
    task meets the error in file order as the serial pass does."""
    sizes = [os.path.getsize(file) for file in files]
    part_size = max(sum(sizes) / parts, 1)
    ranges = []
    for number, (file, size) in enumerate(zip(files, sizes)):
        pieces = max(1, round(size / part_size))
        cuts = [0]
        try:
            with open(file, "rb") as handle:
                for piece in range(1, pieces):
                    handle.seek(max(size * piece // pieces - 1, 0))
                    handle.readline()  # on to just after the next newline
                    if cuts[-1] < handle.tell() < size:  # a line longer than a piece leaves no cut inside it
                        cuts.append(handle.tell())
        except OSError:
            cuts = [0]
        cuts.append(size)
        ranges += [LineRange(number, str(file), start, end) for start, end in zip(cuts, cuts[1:])]
    return ranges


def count_newlines(line_range: LineRange) -> int:
    """The newlines in `line_range` (0 for a file that cannot be read: its task reports that)."""
    count, left = 0, line_range.end - line_range.start
    try:
        with open(line_range.path, "rb") as handle:
            handle.seek(line_range.start)
            while left > 0:
                block = handle.read(min(_BLOCK, left))
                if not block:
                    break
                count, left = count + block.count(b"\n"), left - len(block)
    except OSError:
        return 0
    return count


def map_line_ranges(task: Callable[[LineRange], Any], files: Sequence[Path], processes: int) -> list:
    """[task(range) for each of the `byte_ranges` of `files`], in at most `processes` forked processes, in file
    order.

    `task` is inherited by fork, never pickled. The first range whose task raises, in file order, raises its
    exception here.

    Raises:
        MemoryError: a process died without its results (module docstring).
    """
    ranges = byte_ranges(files, processes)
    numbered, next_line = [], {}
    for line_range, newlines in zip(ranges, in_processes(count_newlines, ranges, processes)):
        first_line = next_line.get(line_range.file_number, 1)
        numbered.append(line_range._replace(first_line=first_line))
        next_line[line_range.file_number] = first_line + newlines
    return in_processes(task, numbered, processes)


def in_processes(function: Callable[[LineRange], Any], ranges: Sequence[LineRange], processes: int) -> list:
    """[function(range) for range in ranges], the ranges dealt in contiguous runs of about equal bytes to at most
    `processes` forked processes; each process stops at its first exception, and the first in range order is
    raised here."""
    context = multiprocessing.get_context("fork")
    runs = _contiguous_runs(ranges, processes)
    started = []
    try:
        for run in runs:
            receiving, sending = context.Pipe(duplex=False)
            process = context.Process(target=_work, args=(function, run, sending), daemon=True)
            process.start()
            sending.close()  # the child's copy is the only one left: its death closes the pipe
            started.append((process, receiving))
        results = []
        for process, receiving in started:
            try:
                done, failure = receiving.recv()
            except EOFError:
                process.join()
                raise MemoryError(f"a process indexing the data died (exit status {process.exitcode}: killed by "
                                  "a signal, as the kernel kills a process when memory runs out)") from None
            results += done
            if failure is not None:
                raise failure
        return results
    finally:
        for process, receiving in started:
            receiving.close()
            if process.is_alive():
                process.terminate()
            process.join()


def _contiguous_runs(ranges: Sequence[LineRange], processes: int) -> list[list[LineRange]]:
    """`ranges` cut, in order, into at most `processes` runs of about equal bytes."""
    total = sum(line_range.end - line_range.start for line_range in ranges)
    runs: list[list[LineRange]] = [[]]
    done = 0
    for line_range in ranges:
        if runs[-1] and len(runs) < processes and done >= total * len(runs) / processes:
            runs.append([])
        runs[-1].append(line_range)
        done += line_range.end - line_range.start
    return runs


def _work(function: Callable[[LineRange], Any], run: list[LineRange], sending) -> None:
    """In a worker: signals as the module docstring says; ([function(range) ...] up to the first exception, that
    exception or None) sent back."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    done, failure = [], None
    try:
        for line_range in run:
            done.append(function(line_range))
    except Exception as error:  # noqa: BLE001 - raised in the parent, in range order
        failure = error
    sending.send((done, failure))
    sending.close()
