"""Every CI run: the .cu sources compile with the machine's nvcc for sm_80 and sm_90 (no GPU needed)."""

import subprocess

import pytest

from ebm_cuda import build, library
from ebm_cuda.library import KernelError, Library

NVCC = build.find_nvcc()


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (no CUDA toolkit on this machine; set NVCC or CUDA_HOME to run this check)")
def test_kernels_compile_for_sm80_and_sm90_and_load(tmp_path):
    out = tmp_path / "libebm_cuda.so"
    command = build.nvcc_command(["80", "90"], out)
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"{' '.join(command)}\n{run.stderr[-4000:]}"
    assert "warning" not in run.stderr.lower(), run.stderr[-4000:]
    lib = Library(str(out), "cuda")  # every C entry point the bindings declare is there
    if library.cuda_unavailable_reason() is not None:  # no GPU: a launch fails with CUDA's own message
        with pytest.raises(KernelError, match="ebm_cuda cuda kernel normal: .+"):
            lib.call("normal", None, 10, 3, 0, 0, None)


def test_the_cuda_sources_include_no_torch_headers():
    for path in [build.CSRC / "kernels.cu", build.CSRC / "host.cpp", *(build.CSRC / "ebm").glob("*.h")]:
        includes = [line for line in path.read_text().splitlines() if line.startswith("#include")]
        assert not any("torch" in line or "ATen" in line or "c10" in line for line in includes), (path, includes)


def test_host_build_is_cached_by_content(tmp_path, monkeypatch):
    monkeypatch.setenv("EBM_CUDA_CACHE", str(tmp_path))
    first = build.build_host()
    assert first.parent == tmp_path and first.exists()
    mtime = first.stat().st_mtime_ns
    assert build.build_host() == first and first.stat().st_mtime_ns == mtime  # not rebuilt
