"""ebm-cuda as an installed plugin: discovered through its entry point, unavailable CUDA explained."""

import subprocess
import sys

import pytest
import torch

import ebmcore
from ebmcore.errors import BackendUnavailableError
from ebm_cuda import backends, build, library
from ebmcore.kernels.resolve import clear_cache

NO_CUDA = library.cuda_unavailable_reason() is not None


def test_backends_come_from_the_installed_distribution():
    for name in ("cuda", "cpu_fused"):
        entry = ebmcore.registry.get("kernel", name)
        assert entry.distribution == "ebm-cuda" and entry.plugin == "cuda"


@pytest.mark.skipif(not NO_CUDA, reason="this machine can run the CUDA kernels")
def test_cuda_backend_reports_why_it_cannot_run():
    reason = library.cuda_unavailable_reason()
    assert "CUDA" in reason or "nvcc" in reason
    why = ebmcore.explain("gaussian_langevin_chain", device="cuda", dtype=torch.float32)
    row = next(c for c in why.candidates if c.backend == "cuda")
    assert not row.chosen and reason in row.reason
    with pytest.raises(BackendUnavailableError, match="cuda"):
        ebmcore.kernels.resolve_kernel("gaussian_gradient", torch.device("cuda"), torch.float32, backend="cuda")


def _ebm(*args: str) -> str:
    """``ebm <args>``'s output; a failure shows what it printed (on the first GPU machine this test failed and said
    nothing more than CalledProcessError)."""
    run = subprocess.run([sys.executable, "-m", "ebmcore.cli", *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"ebm {' '.join(args)}: exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run.stdout


def test_ebm_backends_and_ebm_cuda_info_show_the_backends():
    out = _ebm("backends")
    assert "cpu_fused" in out and "cuda" in out, out
    if NO_CUDA:
        assert library.cuda_unavailable_reason() in out, out
    info = _ebm("cuda", "info")
    assert "cpu_fused  available" in info and ("cuda       unavailable" in info) == NO_CUDA, info
    assert "triton" in out and ("triton     unavailable" in info) == NO_CUDA, (out, info)


def test_cpu_fused_is_selected_by_name_only_for_plain_ops():
    x = torch.randn(4, 3)
    assert ebmcore.explain("gaussian_gradient", x).chosen.backend == "torch"
    assert ebmcore.explain("gaussian_langevin_chain", x).chosen.backend == "cpu_fused"
    with ebmcore.use_backend("cpu_fused"):
        assert ebmcore.explain("gaussian_gradient", x).chosen.backend == "cpu_fused"


def test_on_cuda_the_per_op_kernels_measured_slower_than_torch_rank_below_it():
    """Read from the registered backend's kernels, as the resolver reads them: the double well's energy and gradient
    below the reference (measured slower on an H200), the other energies' and every chain above it."""
    cuda = ebmcore.registry.get("kernel", "cuda").component
    assert set(backends.CUDA_PER_OP_SLOWER) == {"double_well"}
    for name in ("gaussian", "double_well", "rosenbrock", "harmonic"):
        slower = name in backends.CUDA_PER_OP_SLOWER
        for op in (f"{name}_energy", f"{name}_gradient"):
            assert cuda.kernels[op].priority == (-10 if slower else 10), op
        assert cuda.kernels[f"{name}_langevin_chain"].priority == 10


def _nvcc_fails(archs: list[str]):
    """A CUDA build that fails at once: the real one, in an empty cache, compiles kernels.cu (over 60 s)."""
    raise build.BuildError(f"nvcc failed for sm_{'_'.join(archs)} (not run: this test's stand-in)")


def test_a_failed_build_is_a_reason_and_sampling_falls_back(monkeypatch, tmp_path):
    """The host build fails (CXX=/bin/false, an empty cache), and so does the CUDA build where CUDA is present
    (:func:`_nvcc_fails`): each is a reason, and sampling falls back to the per-step loop."""
    from ebm_samplers import LangevinSampler

    monkeypatch.setattr(library, "_loaded", {})
    monkeypatch.setenv("CXX", "/bin/false")
    monkeypatch.setenv("EBM_CUDA_CACHE", str(tmp_path))
    monkeypatch.setattr(build, "build_cuda", _nvcc_fails)
    clear_cache()
    try:
        reason = library.host_unavailable_reason()
        assert reason is not None and "could not be built" in reason and "/bin/false" in reason
        if library._cuda_precondition() is None:  # CUDA and nvcc here: the failed build is the reason
            assert "could not be built" in library.cuda_unavailable_reason()
        energy = ebmcore.energy("harmonic", dim=2)
        x0 = torch.randn(8, 2)
        out = LangevinSampler(energy, step_size=0.1).sample(x0, 3, generator=torch.Generator().manual_seed(0))
        per_step = LangevinSampler(energy, step_size=0.1, fused=False).sample(x0, 3, generator=torch.Generator().manual_seed(0))
        assert torch.equal(out, per_step)  # the fused chain was not chosen
    finally:
        clear_cache()


def test_the_failed_build_test_runs_no_nvcc_where_cuda_is_present(monkeypatch, tmp_path):
    """With CUDA present (simulated here) the test above fails the CUDA build without running nvcc: on the H100 of
    issue 38 it compiled kernels.cu in its empty cache, and was killed after 90 s. Here nvcc is a script that logs its
    calls."""
    log, nvcc = tmp_path / "nvcc.log", tmp_path / "nvcc"
    nvcc.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexit 1\n')
    nvcc.chmod(0o755)
    monkeypatch.setenv("NVCC", str(nvcc))
    monkeypatch.setattr(library, "_cuda_precondition", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    (tmp_path / "cache").mkdir()
    test_a_failed_build_is_a_reason_and_sampling_falls_back(monkeypatch, tmp_path / "cache")
    assert "could not be built" in library._loaded["cuda-sm90"]  # the CUDA build was tried and failed
    assert not log.exists(), f"nvcc ran:\n{log.read_text()}"
