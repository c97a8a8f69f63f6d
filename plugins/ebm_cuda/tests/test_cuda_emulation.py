"""``kernels.cu`` itself run on the host under sanitizers, on every CI run: no GPU needed.

g++ compiles the CUDA build's source as C++ with ``csrc/ebm/cuda_emulation.h`` (``build.build_cuda_emulated``): a
block's threads are OS threads that meet at a real ``__syncthreads()`` barrier, and its dynamic shared memory is a
heap buffer of exactly the launch's bytes. ``benchmarks/gpu_check_kernels.py --emulated`` then runs every entry point
of ``kernels.cu`` (energy and gradient, Langevin/HMC/NUTS chains, both step kernels, the normals, Philox, the
refusals) against the host build on the same Philox stream, in a child process with the sanitizer runtimes preloaded,
any report fatal: under AddressSanitizer and UBSan at the ``memcheck`` sizes (every energy, dtype and MAXD class, 333
chains: partial blocks; every ``ebm_cuda_*`` function of ``kernels.cu`` must have run), under ThreadSanitizer at the ``racecheck`` sizes (a host-side racecheck of the shared-memory
tiles between barriers). The same libraries with a planted defect (``EBM_CUDA_EMULATION_PLANT``: a shared allocation 4
bytes short; a ``__syncthreads()`` that waits for no one) show that each run reports one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ebm_cuda import build

ROOT = Path(__file__).resolve().parents[3]

needs_asan = pytest.mark.skipif(
    build.sanitizer_runtimes("address") is None, reason="the C++ compiler has no AddressSanitizer/UBSan runtime"
)
needs_tsan = pytest.mark.skipif(
    build.sanitizer_runtimes("thread") is None, reason="the C++ compiler has no ThreadSanitizer runtime"
)


@pytest.fixture(scope="module")
def emulated() -> dict[str, Path]:
    """The emulated CUDA builds for the sanitizers this compiler has, compiled side by side (about 25 s and 6 s, once)."""
    kinds = [kind for kind in ("address", "thread") if build.sanitizer_runtimes(kind) is not None]
    with ThreadPoolExecutor(len(kinds) or 1) as pool:
        return dict(zip(kinds, pool.map(build.build_cuda_emulated, kinds)))


def _check_kernels(sanitizer: str, library: Path, sizes: str, plant: str | None = None) -> tuple[int, str]:
    """``gpu_check_kernels.py --emulated library --sizes sizes`` in a child process under ``sanitizer``, against the
    plain host build; its exit status and output."""
    env = {
        **os.environ,
        **build.sanitizer_environment(sanitizer),
        "EBM_CUDA_HOST_LIBRARY": str(build.build_host()),
        "OMP_NUM_THREADS": "1",
    }
    env.pop("EBM_CUDA_EMULATION_PLANT", None)
    if plant:
        env["EBM_CUDA_EMULATION_PLANT"] = plant
    run = subprocess.run(
        [sys.executable, "benchmarks/gpu_check_kernels.py", "--emulated", str(library), "--sizes", sizes],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return run.returncode, run.stdout + run.stderr


def test_the_emulated_build_compiles_kernels_cu_as_cpp():
    command = build.emulated_cuda_command("OUT", cxx="c++")
    assert command[1:4] == ["-x", "c++", "-DEBM_CUDA_EMULATION"] and str(build.CSRC / "kernels.cu") in command
    assert "-fsanitize=address,undefined" in command and "-O3" not in command and "-fopenmp" not in command
    assert "-fsanitize=thread" in build.emulated_cuda_command("OUT", "thread", cxx="c++")
    # the emulation header keys the CUDA builds' cache, not the host build's (host.cpp does not include it)
    assert build.CSRC / "ebm" / "cuda_emulation.h" in build._sources("kernels.cu")
    assert build.CSRC / "ebm" / "cuda_emulation.h" not in build._sources("host.cpp")


@needs_asan
def test_every_cuda_entry_point_equals_the_host_build_under_asan_and_ubsan(emulated):
    status, report = _check_kernels("address", emulated["address"], "memcheck")
    assert status == 0 and "Sanitizer" not in report and "runtime error" not in report, report[-6000:]
    # 12 energy x dtype checks over d in {1, 3, 8, 16, 17, 33, 64}, the step kernels, layouts, the refusals
    assert report.count("PASSED") == 15 and "FAILED" not in report, report[-3000:]
    assert "d in [1, 3, 8, 16, 17, 33, 64]" in report and "PASSED  refusals" in report, report[-3000:]
    # every entry point of kernels.cu ran (a new one fails here until the harness calls it)
    entry_points = set(re.findall(r"^int ebm_cuda_(\w+)\(", (build.CSRC / "kernels.cu").read_text(), re.M))
    ran = re.search(r"^emulated entry points run: (.*)$", report, re.M)
    assert ran and set(ran.group(1).split()) == entry_points, (ran and ran.group(0), sorted(entry_points))


@needs_tsan
def test_the_shared_memory_tiles_have_no_race_under_tsan(emulated):
    status, report = _check_kernels("thread", emulated["thread"], "racecheck")
    assert status == 0 and "ThreadSanitizer" not in report, report[-6000:]
    assert report.count("PASSED") == 11 and "FAILED" not in report, report[-3000:]


@needs_asan
def test_asan_reports_a_shared_tile_4_bytes_short(emulated):
    status, report = _check_kernels("address", emulated["address"], "memcheck", plant="short-shared")
    assert status != 0 and "AddressSanitizer: heap-buffer-overflow" in report, report[-6000:]
    assert "chain_kernel" in report, report[-6000:]  # in a chain kernel's tile, the one launch with shared memory


@needs_tsan
def test_tsan_reports_the_race_of_a_barrier_that_waits_for_no_one(emulated):
    status, report = _check_kernels("thread", emulated["thread"], "racecheck", plant="no-barrier")
    # the first race seen varies: stage_params' or load_tile's writes against another thread's reads, in kernels.cu or
    # in the energy of ebm/energies.h reading the staged parameters; never in the emulation itself
    race = re.search(
        r"SUMMARY: ThreadSanitizer: data race \S*csrc/(kernels\.cu|ebm/(?!cuda_emulation)\w+\.h):\d+"
        r"|SUMMARY: ThreadSanitizer: data race \S*csrc/ebm/cuda_emulation\.h:\d+ in ebm_emulation::read_shared_group",
        report,
    )
    assert status != 0 and race, report[-6000:]


GROUP_READS = r"""
#include <stdio.h>
#include "ebm/cuda_emulation.h"
#include "ebm/energies.h"

// A 3-float parameter staged in `staged` floats of shared memory, and nothing after it: each thread reads it through
// ebm::param.
__global__ void stage_and_read(float* out, int staged) {
  EBM_DYNAMIC_SHARED(float, s);
  for (int k = (int)threadIdx.x; k < staged; k += (int)blockDim.x) s[k] = k < 3 ? 1.0f + k : 0.0f;
  __syncthreads();
  out[threadIdx.x] = ebm::param(s, 0) + ebm::param(s, 1) + ebm::param(s, 2);
}

int main(int argc, char** argv) {
  const int staged = atoi(argv[1]);
  float out[2];
  EBM_LAUNCH(1, 2, staged * sizeof(float), 0, stage_and_read)(out, staged);
  printf("%g %g\n", out[0], out[1]);
  return 0;
}
"""


@needs_asan
def test_the_emulation_reads_a_staged_parameters_whole_16_byte_group(tmp_path):
    """The GPU reads staged parameters as 16-byte vectors, past a tensor's end up to its group's (LDS.128:
    compute-sanitizer racecheck found the harmonic centre's last group reaching the first chain's tile row, which its
    thread writes). The emulation reads the whole group (ebm::param), so what a group reaches is seen by the
    sanitizers: here, a 3-float parameter at the end of the block's shared memory is read 4 bytes past it (for
    ThreadSanitizer, in kernels.cu, a tile row another thread writes: test_the_shared_memory_tiles_have_no_race_under_tsan),
    and the parameter padded to its whole group, as kernels.cu stages it, is read cleanly."""
    (tmp_path / "groups.cpp").write_text(GROUP_READS)
    program = tmp_path / "groups"
    subprocess.run(
        [
            build.find_cxx(),
            *build.SANITIZER_FLAGS,
            "-std=c++17",
            "-pthread",
            "-DEBM_CUDA_EMULATION",
            f"-I{build.CSRC}",
            str(tmp_path / "groups.cpp"),
            "-o",
            str(program),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {**os.environ, **build.SANITIZER_OPTIONS["address"]}
    unpadded, padded = (
        subprocess.run([str(program), staged], capture_output=True, text=True, timeout=60, env=env) for staged in ("3", "4")
    )
    assert unpadded.returncode != 0 and "AddressSanitizer: heap-buffer-overflow" in unpadded.stderr, unpadded.stderr[-3000:]
    assert "ebm_emulation::read_shared_group" in unpadded.stderr, unpadded.stderr[-3000:]
    assert padded.returncode == 0 and padded.stdout == "6 6\n", padded.stderr[-3000:]


LAUNCHES = r"""
#include <stdio.h>
#include "ebm/cuda_emulation.h"

// Threads past n return before the barriers; the others swap values through shared memory across two of them.
__global__ void rotate(int* out, int n) {
  EBM_DYNAMIC_SHARED(int, s);
  const int t = (int)threadIdx.x;
  if (t >= n) return;
  s[t] = (int)blockIdx.x * 1000 + t;
  __syncthreads();
  const int v = s[(t + 1) % n];
  __syncthreads();
  s[t] = v;
  __syncthreads();
  out[blockIdx.x * n + t] = s[(t + 1) % n] + (int)(gridDim.x * 100000 + blockDim.x * 1000000);
}

int main() {
  const int n = 37, blocks = 3;
  int out[blocks * n];
  EBM_LAUNCH(blocks, 64, n * sizeof(int), 0, rotate)(out, n);
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < n; ++t)
      if (out[b * n + t] != b * 1000 + (t + 2) % n + blocks * 100000 + 64 * 1000000) { printf("wrong %d %d\n", b, t); return 1; }
  printf("%s\n", cudaGetErrorString(cudaGetLastError()));
  EBM_LAUNCH(1, 1025, 0, 0, rotate)(out, 1);
  printf("%s\n", cudaGetErrorString(cudaGetLastError()));
  EBM_LAUNCH(1, 32, 48 * 1024 + 4, 0, rotate)(out, 1);
  printf("%s\n", cudaGetErrorString(cudaGetLastError()));
  printf("%s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
"""


@needs_asan
def test_a_thread_that_returns_leaves_the_barrier_and_bad_launches_fail(tmp_path):
    """The emulation itself: threads that return early do not hold up the barrier (a deadlock here is a timeout),
    values pass between threads through shared memory across barriers, block after block; a block of 1025 threads
    and 48 KB + 4 of shared memory fail as CUDA fails them, and cudaGetLastError() clears the error."""
    (tmp_path / "launches.cpp").write_text(LAUNCHES)
    program = tmp_path / "launches"
    subprocess.run(
        [
            build.find_cxx(),
            *build.SANITIZER_FLAGS,
            "-std=c++17",
            "-pthread",
            f"-I{build.CSRC}",
            str(tmp_path / "launches.cpp"),
            "-o",
            str(program),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    run = subprocess.run([str(program)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert run.stdout.splitlines() == ["no error", "invalid configuration argument", "invalid argument", "no error"]
