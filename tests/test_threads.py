"""The jobs' thread count: as configured, or the cores no other process keeps busy (ebmcore.threads)."""

import os

import pytest
import torch

from ebmcore import threads


@pytest.mark.parametrize(
    "cores, load, free", [(2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.0, 1), (2, 3.7, 1), (16, 3.2, 13), (16, 0.0, 16)]
)
def test_free_cores_are_the_cores_less_the_load(monkeypatch, cores, load, free):
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert threads.free_cores() == free


def test_free_cores_without_a_load_average_are_all_cores(monkeypatch):
    def unreadable():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "getloadavg", unreadable)
    assert threads.free_cores() == 8


def test_job_threads_sets_and_restores(monkeypatch):
    before = torch.get_num_threads()
    with threads.job_threads(1) as n:
        assert n == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    monkeypatch.setattr(threads, "free_cores", lambda: 1)
    with threads.job_threads(0) as n:  # the default: the free cores, never more than torch's own default
        assert n == 1 and torch.get_num_threads() == 1
    monkeypatch.setattr(threads, "free_cores", lambda: 10_000)
    with threads.job_threads(0) as n:
        assert n == before
    with pytest.raises(RuntimeError), threads.job_threads(1):
        raise RuntimeError("a failing job")
    assert torch.get_num_threads() == before  # restored after an error too


@pytest.mark.parametrize("value", [100000, threads.os.cpu_count() * 4 + 1])
def test_a_thread_count_past_the_limit_is_a_config_error_naming_it(value):
    """Issue 40: `--threads 100000` ended the job with SIGSEGV; the configuration refuses it, naming the limit."""
    from ebmcore.config import max_threads, thread_count

    assert max_threads() == 4 * os.cpu_count()
    assert f"must be at most {max_threads()}" in thread_count(value)
    assert thread_count(max_threads()) is None and thread_count(0) is None and "must be >= 0" in thread_count(-1)


def test_job_threads_sets_and_restores_the_blas_pools_too():
    """Issue 40: --threads set torch's pools only; numpy's OpenBLAS (or MKL) kept one thread per core."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    import numpy as np

    np.ones((2, 2)) @ np.ones((2, 2))  # numpy's BLAS is loaded
    blas = lambda: [pool["num_threads"] for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"]  # noqa: E731
    assert blas(), "no BLAS library loaded"
    with threadpoolctl.threadpool_limits(limits=3, user_api="blas"):
        before = blas()
        with threads.job_threads(1):
            assert set(blas()) == {1}
        assert blas() == before
        with threads.job_threads(2):
            assert set(blas()) == {2}
        assert blas() == before
