"""One clock for every timing: marks on the device's timeline (CUDA events, read after a sync, so a
mark adds no synchronisation; `time.perf_counter` elsewhere) and seconds between any two marks."""

from __future__ import annotations

import time
from typing import Any


class Clock:
    """Time marks on one device's timeline; mark 0 is set at creation."""

    def __init__(self, device: Any = "cpu"):
        import torch

        self.cuda = torch.device(device).type == "cuda"
        self.marks: list[Any] = []
        self.mark()

    def mark(self) -> int:
        """Record a mark now; return its index."""
        if self.cuda:
            import torch

            self.marks.append(torch.cuda.Event(enable_timing=True))
            self.marks[-1].record()
        else:
            self.marks.append(time.perf_counter())
        return len(self.marks) - 1

    def seconds(self, i: int = 0, j: int = -1) -> float:
        """Seconds from mark `i` to mark `j` (CUDA marks must have completed: sync first)."""
        a, b = self.marks[i], self.marks[j]
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def elapsed(self) -> float:
        """Seconds since mark 0, now (a CPU clock; a CUDA clock synchronises to read it)."""
        self.mark()
        if self.cuda:
            self.marks[-1].synchronize()
        return self.seconds(0, -1)
