"""Every CI run: the .cu sources compile with the machine's nvcc for sm_80 and sm_90 (no GPU needed), and no
kernel spills registers to local memory on either."""

import re
import subprocess

import pytest

from ebm_cuda import build
from ebm_cuda.library import KernelError, Library
from ebm_cuda.testing import gpu_absent_reason

NVCC = build.find_nvcc()


_PROPERTIES = re.compile(
    r"Function properties for (\S+)\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def spilling_kernels(ptxas_log: str) -> tuple[int, list[str]]:
    """From ``nvcc -Xptxas -v`` output: how many functions ptxas reported, and those that spill (name: stores/loads).
    Counts every "spill stores" line, named or not (the per-architecture ptxas runs may interleave their lines)."""
    lines = _SPILLS.findall(ptxas_log)
    named = {m.start(3): m.group(1) for m in _PROPERTIES.finditer(ptxas_log)}
    spills = [
        f"{named.get(m.start(), '?')}: {m.group(1)} B stores, {m.group(2)} B loads"
        for m in _SPILLS.finditer(ptxas_log)
        if m.group(1) != "0" or m.group(2) != "0"
    ]
    return len(lines), spills


def test_the_spill_report_is_read():
    log = (
        "ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_90'\n"
        "ptxas info    : Function properties for _Z6kernelPf\n    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 37 registers, used 1 barriers\n"
        "ptxas info    : Function properties for _Z4nutsPf\n    64 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
    )
    assert spilling_kernels(log) == (2, ["_Z4nutsPf: 8 B stores, 12 B loads"])


@pytest.mark.skipif(
    NVCC is None, reason="nvcc not found (no CUDA toolkit on this machine; set NVCC or CUDA_HOME to run this check)"
)
def test_kernels_compile_for_sm80_and_sm90_without_spills_and_load(tmp_path):
    out = tmp_path / "libebm_cuda.so"
    command = build.nvcc_command(["80", "90"], out)
    command[1:1] = ["-Xptxas", "-v"]  # ptxas reports each kernel's registers and spills (the build is otherwise the same)
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"{' '.join(command)}\n{run.stderr[-4000:]}"
    log = run.stdout + run.stderr
    assert "warning" not in log.lower(), log[-4000:]
    reported, spills = spilling_kernels(log)
    assert reported > 50, f"ptxas reported {reported} functions: is -Xptxas -v still honoured?\n{log[-2000:]}"
    assert not spills, "kernels spill registers to local memory:\n" + "\n".join(spills)
    lib = Library(str(out), "cuda")  # every C entry point the bindings declare is there
    if gpu_absent_reason() is not None:  # no GPU: a launch fails with CUDA's own message
        with pytest.raises(KernelError, match="ebm_cuda cuda kernel normal: .+"):
            lib.call("normal", None, 10, 3, 0, 0, None)


def test_the_cuda_sources_include_no_torch_headers():
    for path in [build.CSRC / "kernels.cu", build.CSRC / "host.cpp", *(build.CSRC / "ebm").glob("*.h")]:
        includes = [line for line in path.read_text().splitlines() if line.startswith("#include")]
        assert not any("torch" in line or "ATen" in line or "c10" in line for line in includes), (path, includes)


def test_host_build_is_cached_by_content():
    """The session's cache (``$EBM_CUDA_CACHE``, where the other tests' host build already is: a fresh cache here
    would compile host.cpp again, 25 s, to show the same thing)."""
    first = build.build_host()
    assert first.parent == build.cache_dir() and first.exists()
    mtime = first.stat().st_mtime_ns
    assert build.build_host() == first and first.stat().st_mtime_ns == mtime  # not rebuilt


def test_the_cache_key_ignores_where_the_compiler_and_the_tree_are(monkeypatch, tmp_path):
    """A cache carried to another machine (same compiler version) or another checkout is used as is: on the first GPU
    machine a carried CUDA build was rebuilt (70 s) because the key held nvcc's absolute path."""
    here = build.nvcc_command(["90"], "OUT", nvcc="/usr/local/bin/nvcc")
    there = build.nvcc_command(["90"], "OUT", nvcc="/usr/local/cuda/bin/nvcc")
    assert build._digest("kernels.cu", here, "v13.0") == build._digest("kernels.cu", there, "v13.0")
    moved = [arg.replace(str(build.CSRC), str(tmp_path / "elsewhere" / "csrc")) for arg in here]
    sources = build._sources("kernels.cu")
    monkeypatch.setattr(build, "CSRC", tmp_path / "elsewhere" / "csrc")
    monkeypatch.setattr(build, "_sources", lambda unit: sources)  # the same bytes, read from the old place
    # what changes the library still changes the key: the flags, the architectures, the compiler's version
    key = build._digest("kernels.cu", moved, "v13.0")
    monkeypatch.undo()
    assert key == build._digest("kernels.cu", here, "v13.0")
    assert build._digest("kernels.cu", build.nvcc_command(["80"], "OUT", nvcc="nvcc"), "v13.0") != key
    assert build._digest("kernels.cu", here, "v12.8") != key
