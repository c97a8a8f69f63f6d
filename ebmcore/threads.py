"""How many threads a job runs with: as configured, or as many cores as no other process keeps busy; torch's pools
and those of the numerical libraries loaded beside it (numpy's OpenBLAS or MKL, OpenMP: ``threadpoolctl``) alike."""

from __future__ import annotations

import contextlib
import math
import os
from typing import Iterator

import torch
from threadpoolctl import threadpool_limits

__all__ = ["free_cores", "job_threads"]


def free_cores() -> int:
    """The cores no other process keeps busy now: ``os.cpu_count()`` less the 1-minute load average, rounded up, at
    least 1 (all of them where the load average cannot be read). With two threads on a 2-core machine whose other
    core is busy, PyTorch's threads wait on each other: ``ebm sample`` took 17.8 s against 3.6 s with one thread
    (docs/cli.md#threads)."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        return cores
    return max(1, min(cores, cores - math.ceil(load - 0.5)))


@contextlib.contextmanager
def job_threads(threads: int) -> Iterator[int]:
    """Within the block, torch runs ``threads`` intra-op threads (0: :func:`free_cores`, capped at torch's default),
    and so do the BLAS and OpenMP pools of the libraries loaded in the process (numpy's OpenBLAS, scipy's, MKL:
    ``threadpoolctl.threadpool_limits``); every setting before the block is restored after it. Yields the number
    used."""
    before = torch.get_num_threads()
    n = threads or min(before, free_cores())
    torch.set_num_threads(n)
    try:
        with threadpool_limits(limits=n):
            yield n
    finally:
        torch.set_num_threads(before)
