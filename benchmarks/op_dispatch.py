#!/usr/bin/env python
"""What dispatching through ``torch.ops.ebm_cuda`` costs on the CPU: one step of the Gaussian Langevin chain (1,000 chains,
dim 10, the host build) called three ways, interleaved, median of ``--rounds`` rounds of ``--calls`` calls each:

- ``direct``: the implementation (``ebm_cuda.analytic_ops._langevin_chain``) as a Python call;
- ``library``: ``ebm_cuda.dispatch.call`` -> ``torch.ops.ebm_cuda.langevin_chain`` (``torch.library.Library``), what ebm runs;
- ``custom_op``: the same implementation wrapped by ``torch.library.custom_op`` (how the ops were defined before).

    .venv/bin/python benchmarks/op_dispatch.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

import ebmcore
import ebm_cuda.plugin  # noqa: F401  (registers the ops)
from ebm_cuda import analytic_ops, dispatch
from ebm_cuda.energies import LAYOUTS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    energy = ebmcore.GaussianEnergy(torch.zeros(10), covariance=torch.eye(10))
    layout = LAYOUTS["gaussian"]
    inputs = (
        torch.randn(1000, 10, generator=torch.Generator().manual_seed(0)),
        layout.code,
        *layout.unpack(*energy.kernel_args()),
        1,
        0.01,
        0.1414,
        None,
        None,
        7,
        0,
    )
    wrapped = torch.library.custom_op("ebm_dispatch_benchmark::langevin_chain", analytic_ops._langevin_chain, mutates_args=())
    ways = {
        "direct": analytic_ops._langevin_chain,
        "library": lambda *a: dispatch.call("langevin_chain", *a),
        "custom_op": wrapped,
    }
    reference = analytic_ops._langevin_chain(*inputs)
    for fn in ways.values():
        assert torch.equal(fn(*inputs), reference)  # the same bits every way
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, fn in ways.items():
            start = time.perf_counter()
            for _ in range(args.calls):
                fn(*inputs)
            times[name].append((time.perf_counter() - start) / args.calls * 1e6)
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, m in medians.items():
        print(f"{name:10s} {m:7.1f} µs per call ({m - medians['direct']:+.1f} over direct)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "what": "one step of gaussian_langevin_chain, 1,000 chains x dim 10, host build, 1 thread",
                    "torch": torch.__version__,
                    "machine": platform.processor() or platform.machine(),
                    "loadavg": open("/proc/loadavg").read().split()[:3],
                    "calls_per_round": args.calls,
                    "us_per_call": times,
                    "median_us": medians,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
