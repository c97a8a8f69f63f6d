"""Helpers for testing the kernels on a GPU, shared by the GPU tests and ``benchmarks/gpu_check.py``.

:func:`cuda_test_reason` decides whether a GPU test runs, skips or fails: it skips only where there
is no GPU, and fails where a GPU is present but the CUDA kernels cannot run on it (nvcc missing, the
build failed), so that a broken build on a GPU machine is never a green, all-skipped run.
:func:`assert_chains_close` compares two runs of the same chains, counting chains that diverged in
both runs as equal. :func:`bf16_products_pass` is what the Triton kernels compute with bfloat16 products, in torch.
:func:`cuda_emulation` runs the ops' CUDA path without a GPU: on CPU tensors, with ``kernels.cu`` built for the host.
:func:`triton_chain_with_noise` runs the Triton chain on given normals. The runtime never imports this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any, Iterator

import torch

from ebm_cuda.library import gpu_absent_reason

if TYPE_CHECKING:
    from ebm_cuda.library import Library

__all__ = [
    "gpu_absent_reason",
    "cuda_test_reason",
    "require_cuda_kernels",
    "assert_chains_close",
    "run_triton_child",
    "bf16_products_pass",
    "cuda_emulation",
    "triton_chain_with_noise",
]


def cuda_test_reason() -> tuple[str, str] | None:
    """``None`` where the CUDA kernels can run here; else ``("skip", why)`` where there is no GPU, and
    ``("fail", why)`` where there is one but the kernels cannot run on it (the build failed, nvcc is
    missing): there the GPU tests must fail, not skip."""
    from ebm_cuda import library

    absent = gpu_absent_reason()
    if absent is not None:
        return ("skip", absent)
    reason = library.cuda_unavailable_reason()
    if reason is not None:
        return (
            "fail",
            f"a GPU is present ({torch.cuda.get_device_name()}) but the CUDA kernels cannot run on it: {reason} "
            "(deselect the GPU tests with -m 'not gpu' to run without them)",
        )
    return None


def require_cuda_kernels() -> None:
    """In a test: skip it where there is no GPU, fail it where there is one but the CUDA kernels cannot run."""
    import pytest

    verdict = cuda_test_reason()
    if verdict is None:
        return
    what, why = verdict
    if what == "skip":
        pytest.skip(f"CUDA kernels cannot run here: {why}")
    pytest.fail(why, pytrace=False)


def _rows_nonfinite(t: torch.Tensor) -> torch.Tensor:
    bad = ~torch.isfinite(t)
    return bad.reshape(bad.shape[0], -1).any(1) if bad.dim() > 1 else bad


def assert_chains_close(
    actual: torch.Tensor, expected: torch.Tensor, *, rtol: float, atol: float, what: str = "chains", max_nonfinite: float = 0.01
) -> int:
    """``torch.testing.assert_close`` for the final states of chains (one chain per row): a chain that is
    non-finite in both runs counts as equal (a chain that diverges does so on every build, where its last
    finite values depend on rounding), and both runs must have the same non-finite chains, at most
    ``max_nonfinite`` of them (a fraction). Compares on the CPU in float64; returns the number of chains
    non-finite in both."""
    actual, expected = actual.detach().cpu().double(), expected.detach().cpu().double()
    assert actual.shape == expected.shape, f"{what}: shapes differ: {tuple(actual.shape)} and {tuple(expected.shape)}"
    bad_a, bad_e = _rows_nonfinite(actual), _rows_nonfinite(expected)
    n_a, n_e = int(bad_a.sum()), int(bad_e.sum())
    assert n_a == n_e, f"{what}: {n_a} non-finite chains against {n_e} expected"
    differ = (bad_a != bad_e).nonzero().flatten()
    assert differ.numel() == 0, f"{what}: chains {differ[:10].tolist()} are non-finite in one run only"
    assert n_a <= max_nonfinite * max(1, actual.shape[0]), (
        f"{what}: {n_a} of {actual.shape[0]} chains are non-finite (more than {max_nonfinite:.0%})"
    )
    keep = ~bad_a
    torch.testing.assert_close(actual[keep], expected[keep], rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")
    return n_a


def assert_most_chains_close(
    actual: torch.Tensor, expected: torch.Tensor, *, rtol: float, atol: float, what: str = "chains", max_apart: int = 1
) -> int:
    """:func:`assert_chains_close` for samplers that take a discrete choice from a continuous comparison (NUTS picks
    a state of its tree by a uniform against weights): where a weight lies within rounding of the uniform, two builds
    pick different states and the chain continues elsewhere. At most ``max_apart`` chains may be apart (an indexing
    bug touches more); all the others must be close. Returns the number apart. Seen on an H200 under compute-sanitizer:
    1 chain of 333 at d = 64, 0.58 apart, with the same tree depth, steps and divergences as the host build's."""
    actual, expected = actual.detach().cpu().double(), expected.detach().cpu().double()
    assert actual.shape == expected.shape, f"{what}: shapes differ: {tuple(actual.shape)} and {tuple(expected.shape)}"
    both_bad = _rows_nonfinite(actual) & _rows_nonfinite(expected)
    close = torch.isclose(actual, expected, rtol=rtol, atol=atol).reshape(actual.shape[0], -1).all(1) | both_bad
    apart = int((~close).sum())
    allowed = max_apart
    assert apart <= allowed, (
        f"{what}: {apart} of {actual.shape[0]} chains apart (at most {allowed} allowed), first at rows "
        f"{(~close).nonzero().flatten()[:10].tolist()}"
    )
    assert_chains_close(actual[close], expected[close], rtol=rtol, atol=atol, what=what)
    return apart


def run_triton_child(script: str, what: str, interpret: bool, cache: str | None = None) -> dict[str, Any]:
    """Run ``python script what`` in a child process and return the JSON on its last line of output: with
    ``TRITON_INTERPRET=1`` (Triton reads it once, when it is imported: the Triton tests interpret their kernels on CPU
    tensors in a child, and compile them for GPUs in another, without it), one thread, and ``cache`` as Triton's cache."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["OMP_NUM_THREADS"] = "1"
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    if cache is not None:
        env["TRITON_CACHE_DIR"] = cache
    proc = subprocess.run([sys.executable, script, what], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bf16_products_pass(net: torch.nn.Sequential, sign: float, x: torch.Tensor) -> tuple[torch.Tensor, list, list]:
    """The pass of the Triton kernels with ``precision="bf16"`` through ``sign · net`` (``Linear``, activation, …,
    ``Linear(·, 1)``) at ``x: (n, d)``, in torch: every matrix product's operands (their float32 values) rounded to
    bfloat16 to nearest even, the rest in float64. Returns ``(∇ₓE: (n, d), [a_0 = x, a_1, …]: the inputs of the hidden
    layers' products, [e_1, …]: ∂E/∂z_l of the hidden layers)``: the kernels' weight gradient of layer ``l`` is the
    product of the rounded ``(c·e_l)ᵀ`` and ``a_{l−1}``."""

    def r(t: torch.Tensor) -> torch.Tensor:
        return t.detach().float().bfloat16().double()

    modules = list(net)
    hidden = [(modules[i], modules[i + 1]) for i in range(0, len(modules) - 1, 2)]
    inputs, derivatives = [x.double()], []
    for linear, activation in hidden:
        bias = 0.0 if linear.bias is None else linear.bias.detach().double()
        z = (r(inputs[-1]) @ r(linear.weight).T + bias).requires_grad_()
        a = activation(z)
        (d,) = torch.autograd.grad(a.sum(), z)
        derivatives.append(d)
        inputs.append(a.detach())
    es = [derivatives[-1] * (sign * modules[-1].weight.detach().double()[0])]
    for l in range(len(hidden) - 1, 0, -1):
        es.insert(0, (r(es[0]) @ r(hidden[l][0].weight)) * derivatives[l - 1])
    return r(es[0]) @ r(hidden[0][0].weight), inputs[:-1], es


@contextlib.contextmanager
def cuda_emulation(lib: Library) -> Iterator[None]:
    """Inside, the ops run CPU tensors on ``lib``, ``kernels.cu`` built for the host (``build.build_cuda_emulated()``,
    loaded as ``Library(path, "cuda")``), as they run CUDA tensors on the CUDA build (its workspaces, no stream: its
    launches return when done), instead of on the host build: how the tests run the ``.cu`` file without a GPU
    (``benchmarks/gpu_check_kernels.py --emulated``)."""
    from ebm_cuda.dispatch import _EMULATED

    token = _EMULATED.set(lib)
    try:
        yield
    finally:
        _EMULATED.reset(token)


def triton_chain_with_noise(x: torch.Tensor, network: Any, noise: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """The Triton chain (``triton_chains.feedforward_langevin_chain``, same keywords) adding the normals of ``noise:
    (n_steps, n, d)`` instead of the stream's: how the tests hold the moves to a reference with the same noise."""
    from ebm_cuda.triton_chains import _langevin_chain

    kw = dict(precision=None, block_n=None, out=None, num_warps=None) | kwargs
    return _langevin_chain(
        x,
        network,
        noise,
        kw["n_steps"],
        kw["step_size"],
        kw["noise_scale"],
        kw["seed"],
        kw["offset"],
        kw["precision"],
        kw["block_n"],
        kw["out"],
        kw["num_warps"],
    )
