"""The kernels' C++ under AddressSanitizer and UndefinedBehaviorSanitizer, on every CI run.

The host build compiles the same kernel math as the CUDA build (``csrc/ebm/*.h``). Here it is compiled with
``build.SANITIZER_FLAGS`` and run, in a child process with the sanitizer runtimes preloaded, over every entry point at
small odd sizes: every energy, dtype and dimension class (``benchmarks/gpu_check_kernels.py --dry``), the network
chains and the losses' ops. Any report is fatal. A planted out-of-bounds read, built and loaded the same way, shows
that the harness does report one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ebm_cuda import build

ROOT = Path(__file__).resolve().parents[3]

needs_sanitizers = pytest.mark.skipif(
    build.sanitizer_runtimes("address") is None, reason="the C++ compiler has no AddressSanitizer/UBSan runtime"
)

NETWORK_CHECKS = """
import torch
from torch import nn
import ebmcore
from ebmcore.energies.program import feedforward_of
from ebm_cuda import feedforward_ops, native
kernels = {k.op: k.fn for k in native.kernels('cpu_fused')}
from ebm_losses import ConvEnergy
g = torch.Generator().manual_seed(0)
for widths in ((3, 40, 1), (5, 17, 33, 1), (1, 64, 64, 1)):
    layers = []
    for a, b in zip(widths[:-2], widths[1:-1]):
        layers += [nn.Linear(a, b), nn.SiLU()]
    net = nn.Sequential(*layers, nn.Linear(widths[-2], 1))
    program = feedforward_of(net)
    x = torch.randn(37, widths[0], generator=g)
    kernels['feedforward_langevin_chain'](x, program, n_steps=3, step_size=0.01, noise_scale=0.1, seed=1, offset=2)
    for by in ("fma", "vdpbf16ps") if "vdpbf16ps built" in feedforward_ops.bf16_instructions() else ("fma",):
        feedforward_ops.BF16_BY = by  # the bfloat16 products, by each way this build has
        kernels['feedforward_langevin_chain'](x, program, n_steps=3, step_size=0.01, noise_scale=0.1, seed=1, offset=2,
                                              precision="bf16")
    feedforward_ops.BF16_BY = "fma"
    kernels['feedforward_denoising_score_matching'](x, torch.randn_like(x), torch.rand(37), program)
    kernels['feedforward_sliced_score_matching'](x, torch.randn_like(x), program)
    kernels['feedforward_energy_gradients'](x, torch.rand(37), torch.rand(37), program)
    kernels['feedforward_contrastive_chain'](x, program, n_steps=2, step_size=0.01, noise_scale=0.1, seed=1, offset=0,
                                              start=(0.5, 0.1), end=(-0.5, None))
stack = ConvEnergy((2, 7, 5), widths=(3, 4), seed=0).program()
kernels['conv_langevin_chain'](torch.randn(5, 2, 7, 5, generator=g), stack, n_steps=2, step_size=0.01, noise_scale=0.1,
                               seed=3, offset=0)
from ebm_cuda import library
assert "libebm_host-sanitized" in library.host().path, library.host().path  # the sanitized build ran all of it
print("network checks done")
"""


def _sanitized_run(library: Path, code: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, **build.sanitizer_environment("address"), "EBM_CUDA_HOST_LIBRARY": str(library), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@needs_sanitizers
def test_every_host_entry_point_runs_clean_under_asan_and_ubsan(tmp_path):
    library = build.build_host_sanitized()
    assert "-fsanitize=address,undefined" in build.sanitized_host_command("OUT") and "-O3" not in build.sanitized_host_command(
        "OUT"
    )
    kernels = _sanitized_run(
        library, ["benchmarks/gpu_check_kernels.py", "--dry", "--sizes", "memcheck", "--json", str(tmp_path / "k.json")]
    )
    report = kernels.stdout + kernels.stderr
    assert kernels.returncode == 0 and "Sanitizer" not in report and "runtime error" not in report, report[-6000:]
    assert report.count("PASSED") >= 14, report[-3000:]
    assert (
        "libebm_host-sanitized"
        in _sanitized_run(library, ["-c", "from ebm_cuda import library; print(library.host().path)"]).stdout
    )
    networks = _sanitized_run(library, ["-c", NETWORK_CHECKS])
    report = networks.stdout + networks.stderr
    assert networks.returncode == 0 and "network checks done" in report and "Sanitizer" not in report, report[-6000:]


@needs_sanitizers
def test_the_harness_reports_a_planted_out_of_bounds_read(tmp_path):
    source = tmp_path / "oob.cpp"
    source.write_text('extern "C" int read_past(const int* a, int n) { return a[n]; }\n')
    library = tmp_path / "liboob.so"
    command = [build.find_cxx(), *build.SANITIZER_FLAGS, "-fPIC", "-shared", str(source), "-o", str(library)]
    subprocess.run(command, check=True, capture_output=True)
    code = (
        "import ctypes, torch\nlib = ctypes.CDLL(%r)\na = torch.arange(5, dtype=torch.int32)\n"
        "print(lib.read_past(ctypes.c_void_p(a.data_ptr()), 5))\n" % str(library)
    )
    run = _sanitized_run(library, ["-c", code])
    assert run.returncode != 0 and "AddressSanitizer" in run.stderr and "heap-buffer-overflow" in run.stderr, run.stderr[-3000:]
