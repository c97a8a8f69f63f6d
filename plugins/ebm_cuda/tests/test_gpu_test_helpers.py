"""On the CPU, the helpers the GPU tests stand on (ebm_cuda.testing): the chain comparison that counts chains
diverged in both runs as equal, and the rule that a GPU test skips only without a GPU and fails where a GPU is
present but the CUDA kernels cannot run (the availability probes monkeypatched)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ebm_cuda import library
from ebm_cuda.testing import assert_chains_close, cuda_test_reason, require_cuda_kernels

TESTS = Path(__file__).resolve().parent


def chains(n=300, d=40, seed=0):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def test_chains_non_finite_in_both_runs_compare_equal():
    a = chains()
    b = a + 1e-6 * chains(seed=1)
    a[17, 3], b[17, 3] = float("nan"), float("nan")
    a[200, :], b[200, 5] = float("inf"), float("-inf")  # the same chain diverged, its other elements differ
    assert assert_chains_close(a, b, rtol=1e-4, atol=1e-4) == 2
    assert assert_chains_close(a[:100, 0], b[:100, 0], rtol=1e-4, atol=1e-4) == 0  # one value per chain


@pytest.mark.parametrize("case", ["different chains", "one run only", "finite values differ", "too many"])
def test_chains_that_do_not_match_fail(case):
    a = chains()
    b = a.clone()
    if case == "different chains":
        a[17, 3], b[18, 3] = float("nan"), float("nan")
        match = "non-finite in one run only"
    elif case == "one run only":
        a[17, 3] = float("nan")
        match = "1 non-finite chains against 0 expected"
    elif case == "finite values differ":
        a[17, 3], b[17, 3] = float("nan"), float("nan")
        b[5, 5] += 1e-2
        match = "Mismatched elements: 1 / "
    else:
        a[:10], b[:10] = float("nan"), float("nan")
        match = "10 of 300 chains are non-finite"
    with pytest.raises(AssertionError, match=match):
        assert_chains_close(a, b, rtol=1e-4, atol=1e-4)


def fake_gpu(monkeypatch, build_reason):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(library, "cuda_unavailable_reason", lambda *a: build_reason)


def test_without_a_gpu_the_gpu_tests_skip(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(library, "cuda_unavailable_reason", lambda *a: pytest.fail("no build without a GPU"))
    assert cuda_test_reason()[0] == "skip"
    with pytest.raises(pytest.skip.Exception, match="no CUDA device is visible"):
        require_cuda_kernels()
    monkeypatch.setattr(torch.version, "cuda", None)
    assert cuda_test_reason() == ("skip", f"no GPU: this torch build has no CUDA (torch {torch.__version__})")


def test_with_a_gpu_a_failed_build_fails_the_gpu_tests(monkeypatch):
    fake_gpu(monkeypatch, "the cuda-sm90 kernels could not be built: building libebm_cuda-sm90 failed (exit 1)")
    what, why = cuda_test_reason()
    assert what == "fail" and "a GPU is present (Fake GPU)" in why and "could not be built" in why
    with pytest.raises(pytest.fail.Exception, match="could not be built"):
        require_cuda_kernels()
    fake_gpu(monkeypatch, "nvcc not found to build the kernels (install the CUDA toolkit, or set NVCC or CUDA_HOME)")
    with pytest.raises(pytest.fail.Exception, match="nvcc not found"):
        require_cuda_kernels()
    fake_gpu(monkeypatch, None)
    assert cuda_test_reason() is None
    require_cuda_kernels()  # runs


def test_ebm_cuda_build_fails_on_a_gpu_machine_whose_build_failed(monkeypatch, capsys):
    from argparse import Namespace

    from ebm_cuda import cli

    fake_gpu(monkeypatch, "the cuda-sm90 kernels could not be built: injected failure")
    assert cli._build(Namespace(arch=None, host_only=False)) == 1
    assert "error: a GPU is present but the CUDA kernels cannot run on it: the cuda-sm90" in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # no GPU: the CUDA build is skipped, saying why
    assert cli._build(Namespace(arch=None, host_only=False)) == 0
    assert "CUDA kernels: skipped (the cuda-sm90 kernels could not be built: injected failure)" in capsys.readouterr().out


def test_test_cuda_device_fails_on_a_gpu_machine_whose_build_failed(tmp_path):
    """End to end: test_cuda_device.py under a fake GPU whose build fails reports errors, not skips."""
    (tmp_path / "fake_gpu_build_fails.py").write_text(
        textwrap.dedent("""
        import torch
        from ebm_cuda import library
        torch.version.cuda = "13.0"
        torch.cuda.is_available = lambda: True
        torch.cuda.get_device_name = lambda *a: "Fake GPU"
        library.cuda_unavailable_reason = lambda *a: "the cuda-sm90 kernels could not be built: injected failure"
    """)
    )
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "fake_gpu_build_fails",
            str(TESTS / "test_cuda_device.py"),
            "-k",
            "philox or resolution",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)},
    )
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert "2 errors" in run.stdout and "skipped" not in run.stdout, run.stdout[-3000:]
    assert "could not be built: injected failure" in run.stdout


def test_most_chains_close_allows_a_few_chains_apart_and_no_more():
    """NUTS on an H200 under compute-sanitizer: one chain of 333 picked another state of the same tree (0.58 apart)."""
    from ebm_cuda.testing import assert_most_chains_close

    expected = torch.randn(333, 64, generator=torch.Generator().manual_seed(0))
    actual = expected.clone()
    actual[317, 53] += 0.58
    assert assert_most_chains_close(actual, expected, rtol=1e-3, atol=1e-3, what="nuts") == 1
    assert assert_most_chains_close(expected, expected, rtol=1e-3, atol=1e-3) == 0
    actual[3, 0] += 1.0  # a second chain apart: more than one
    with pytest.raises(AssertionError, match=r"nuts: 2 of 333 chains apart \(at most 1 allowed\), first at rows \[3, 317\]"):
        assert_most_chains_close(actual, expected, rtol=1e-3, atol=1e-3, what="nuts")
    with pytest.raises(AssertionError, match="shapes differ"):
        assert_most_chains_close(actual[:5], expected, rtol=1e-3, atol=1e-3)
