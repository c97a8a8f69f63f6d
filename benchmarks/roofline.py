#!/usr/bin/env python
"""W4's host chain against this core's roofline: the peak float32 FMA rate (and vdpbf16ps's, where the CPU has
AVX512-BF16) measured by microkernels compiled with the host build's flags (``benchmarks/roofline.cpp``), the chain's
own pieces on one tile (the 64x64 product, the whole gradient), and W4 itself (ULA on the 2-64-64-1 SiLU MLP, 10,000
chains x 100 steps, one thread) with float32 products and with bfloat16 ones (by float32 FMAs on rounded operands,
what ``precision="bf16"`` runs, and by vdpbf16ps), each as GFLOP/s of the products the chain computes, counted from
the network's shape (:func:`product_flops`).

Times are the thread's CPU time (``CLOCK_THREAD_CPUTIME_ID``, ``time.thread_time``): the machine is shared, and CPU
time leaves out the time another process holds the core. Peaks: the best and the median of ``--bursts`` short
bursts; the chain and tile pieces: medians of ``--repeats`` interleaved rounds. BlackJAX's W4 time is the recorded
run's (:data:`RECORDED`), a wall-clock median on a quiet machine.

    .venv/bin/python benchmarks/roofline.py [--json benchmarks/results/2026-11-28-cpu-roofline.json]
    .venv/bin/python benchmarks/roofline.py --show benchmarks/results/2026-11-28-cpu-roofline.json
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "roofline.cpp"
RECORDED = HERE / "results" / "2026-11-28-cpu-1thread-final.json"
"""The full run whose W4 BlackJAX (and ebm) medians the chain is compared with."""
RESULT = HERE / "results" / "2026-11-28-cpu-roofline.json"
"""This script's recorded result (docs/performance.md cites it)."""

WIDTHS = (2, 64, 64)
"""W4's network: inputs, then the hidden widths (the output layer is one unit)."""


def product_flops(widths: tuple[int, ...] = WIDTHS) -> int:
    """FLOPs of the products in one chain step's gradient (a multiply-add = 2): the forward product of every hidden
    layer, the backward product of every hidden layer after the first, and the input gradient (first layer's
    weights). The output layer enters as ``f'(z)·w_out`` (elementwise, not counted: neither are the bias adds, the
    activations, the noise or the move)."""
    pairs = list(zip(widths[:-1], widths[1:]))
    forward = sum(i * o for i, o in pairs)
    backward = sum(i * o for i, o in pairs[1:])
    return 2 * (forward + backward + widths[0] * widths[1])


def _compile(out: Path) -> list[str]:
    from ebm_cuda import build

    cxx = build.find_cxx()
    command = [cxx, *build.HOST_FLAGS, f"-I{build.CSRC}", str(SOURCE), "-o", str(out)]
    subprocess.run(command, check=True)
    return command


def _mlp():
    from torch import nn

    net = nn.Sequential(nn.Linear(2, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 1))
    g = torch.Generator().manual_seed(3)  # benchmarks/run.py's make_mlp
    with torch.no_grad():
        for layer in (net[0], net[2], net[4]):
            bound = 1.0 / layer.weight.shape[1] ** 0.5
            layer.weight.uniform_(-bound, bound, generator=g)
            layer.bias.uniform_(-bound, bound, generator=g)
    return net


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bursts", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--json", default=None)
    ap.add_argument("--show", default=None, help="print a recorded result's summary and exit")
    args = ap.parse_args()
    if args.show:
        print(summary(json.loads(Path(args.show).read_text(encoding="utf-8"))))
        return
    torch.set_num_threads(1)
    from ebm_cuda import feedforward_ops as ff

    with tempfile.TemporaryDirectory() as tmp:
        command = _compile(Path(tmp) / "roofline.so")
        lib = ctypes.CDLL(str(Path(tmp) / "roofline.so"))
    for name in ("roofline_fma", "roofline_dpbf16"):
        getattr(lib, name).restype = ctypes.c_double
        getattr(lib, name).argtypes = (ctypes.c_int64, ctypes.c_void_p)
    lib.roofline_tile.restype = ctypes.c_double
    lib.roofline_tile.argtypes = (ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
    chains = lib.roofline_accumulators()
    sink = (ctypes.c_float * 4)(1.0, 1e-7, 0.5, 0.0)

    # peaks: short bursts (about 0.5 ms each), the best and the median
    iters = 20_000
    fma, dot = [], []
    for _ in range(args.bursts):
        fma.append(chains * iters * 32 / lib.roofline_fma(iters, sink) / 1e9)
        t = lib.roofline_dpbf16(iters, sink)
        if t > 0:
            dot.append(chains * iters * 64 / t / 1e9)
    peaks = {"fma_f32": {"best": max(fma), "median": statistics.median(fma), "flop_per_instruction": 32}}
    if dot:
        peaks["vdpbf16ps"] = {"best": max(dot), "median": statistics.median(dot), "flop_per_instruction": 64}

    # the chain's pieces on one tile of 16 chains, and W4 itself
    net = _mlp()
    flat = torch.cat(
        [net[0].weight.flatten(), net[2].weight.flatten(), net[4].weight.flatten(), net[0].bias, net[2].bias, net[4].bias]
    )
    flat = flat.detach().contiguous()
    W = [net[0].weight.detach(), net[2].weight.detach(), net[4].weight.detach()]
    B = [net[0].bias.detach(), net[2].bias.detach(), net[4].bias.detach()]
    x0 = torch.randn(10_000, 2, generator=torch.Generator().manual_seed(1))
    n, steps, h = 10_000, 100, 0.01
    variants = {"ieee": ("ieee", "fma", 0), "bf16 by FMAs": ("bf16", "fma", 1), "bf16 by vdpbf16ps": ("bf16", "vdpbf16ps", 2)}

    def chain(precision: str, by: str) -> None:
        ff.BF16_BY = by
        ff.feedforward_langevin_chain(x0, W, B, [0, 0], 1.0, steps, h, (2 * h) ** 0.5, None, None, 1, 0, precision)

    runs = 200
    times: dict[str, dict[str, list[float]]] = {k: {"chain": [], "gradient": [], "product": []} for k in variants}
    default_by = ff.BF16_BY
    try:
        for _ in range(args.repeats):
            for name, (precision, by, code) in variants.items():
                grad = lib.roofline_tile(runs * 10, flat.data_ptr(), code, 0, sink)
                if grad < 0:
                    continue
                times[name]["gradient"].append(grad / (runs * 10))
                times[name]["product"].append(lib.roofline_tile(runs * 40, flat.data_ptr(), code, 1, sink) / (runs * 40))
                t = time.thread_time()
                chain(precision, by)
                times[name]["chain"].append(time.thread_time() - t)
    finally:
        ff.BF16_BY = default_by

    per_step = product_flops()
    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))["workloads"]["W4"]["results"]
    blackjax, ebm = recorded["blackjax"]["median_s"], recorded["ebm"]["median_s"]
    peak = peaks["fma_f32"]["median"]
    measured = {}
    for name, t in times.items():
        if not t["chain"]:
            continue
        chain_s, grad_s, prod_s = (statistics.median(t[k]) for k in ("chain", "gradient", "product"))
        measured[name] = {
            "w4_cpu_s": chain_s,
            "w4_gflops": n * steps * per_step / chain_s / 1e9,
            "w4_fraction_of_fma_peak": n * steps * per_step / chain_s / 1e9 / peak,
            "tile_gradient_s": grad_s,
            "tile_gradient_gflops": 16 * per_step / grad_s / 1e9,
            "tile_product_64x64_s": prod_s,
            "tile_product_64x64_gflops": 16 * 2 * 64 * 64 / prod_s / 1e9,
            "blackjax_over_this": blackjax / chain_s,
        }
    result = {
        "what": "W4's host chain (ULA, MLP 2-64-64-1 SiLU, 10,000 chains x 100 steps, 1 thread) against the core's "
        "measured FMA roofline; thread CPU times",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": _machine(),
        "command": "benchmarks/roofline.py",
        "compile": " ".join(_relative(c) for c in command),
        "git": _git(),
        "torch": torch.__version__,
        "accumulators": chains,
        "peak_gflops": peaks,
        "product_flops_per_chain_step": per_step,
        "w4_product_flops": n * steps * per_step,
        "recorded": {
            "file": RECORDED.name,
            "ebm_w4_s": ebm,
            "blackjax_w4_s": blackjax,
            "ebm_w4_gflops": n * steps * per_step / ebm / 1e9,
        },
        "measured": measured,
    }
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    print(summary(result))


def _relative(arg: str) -> str:
    """A compile argument with this checkout's paths relative to its root (the compiler by its name)."""
    root = str(HERE.parent) + "/"
    if arg.startswith("/") and not arg.startswith(root):
        return Path(arg).name
    return arg.replace(root, "")


def _git() -> dict:
    def run(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=HERE.parent, capture_output=True, text=True).stdout.strip()

    return {"commit": run("rev-parse", "--short", "HEAD"), "modified": bool(run("status", "--porcelain"))}


def _machine() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    isa = [f for f in ("avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16") if f in flags.split()]
    return f"{model}, {len(platform.os.sched_getaffinity(0))} CPUs, {' '.join(isa)}"


def summary(r: dict) -> str:
    p = r["peak_gflops"]
    lines = [
        f"{r['machine']} ({r['date']})",
        f"peak float32 FMA: {p['fma_f32']['median']:.0f} GFLOP/s (best burst {p['fma_f32']['best']:.0f})",
    ]
    if "vdpbf16ps" in p:
        lines.append(f"peak vdpbf16ps:   {p['vdpbf16ps']['median']:.0f} GFLOP/s (best burst {p['vdpbf16ps']['best']:.0f})")
    rec = r["recorded"]
    lines.append(
        f"W4 products: {r['product_flops_per_chain_step']} FLOP per chain step, {r['w4_product_flops']:.3g} per run; recorded "
        f"ebm {1e3 * rec['ebm_w4_s']:.1f} ms = {rec['ebm_w4_gflops']:.0f} GFLOP/s, BlackJAX {1e3 * rec['blackjax_w4_s']:.1f} ms"
    )
    for name, m in r["measured"].items():
        lines.append(
            f"{name:18} W4 {1e3 * m['w4_cpu_s']:6.1f} ms CPU = {m['w4_gflops']:5.1f} GFLOP/s "
            f"({m['w4_fraction_of_fma_peak']:.2f} of the FMA peak), BlackJAX/this {m['blackjax_over_this']:.2f}; tile: "
            f"gradient {m['tile_gradient_gflops']:.0f} GFLOP/s, 64x64 product {m['tile_product_64x64_gflops']:.0f} GFLOP/s"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
