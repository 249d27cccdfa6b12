"""Anonymous memory (RssAnon) of this process, and its peak over a stretch of work sampled every 5 ms: what the
data and tensors a run holds cost, not the page cache of the files it reads (memory-mapped pages do not count)."""
from __future__ import annotations

import threading
import time


def rss_anon_bytes() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakAnon:
    """The largest RssAnon seen by a 5 ms sampler since construction; `stop()` returns it above the value at
    construction, `stop(absolute=True)` as it is."""

    def __init__(self) -> None:
        self.baseline = self.peak = rss_anon_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_anon_bytes())
            time.sleep(0.005)

    def stop(self, absolute: bool = False) -> int:
        self._stop.set()
        self._thread.join()
        peak = max(self.peak, rss_anon_bytes())
        return peak if absolute else peak - self.baseline
