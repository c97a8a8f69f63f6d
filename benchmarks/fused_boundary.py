"""Where the host build's fused chains stop beating the per-step loop: time both on the analytic energies over
dimensions, interleaved, and write one JSON file (``--json``). The kernels declare the result
(``ebm_cuda.backends.HOST_CHAINS_PAY_UP_TO``, ``Kernel.pays_up_to``).

    .venv/bin/python benchmarks/fused_boundary.py [--chains 100] [--dims 16,32,64,128] [--json PATH]

One thread; each cell is the best of ``--repeats`` runs of ``--steps`` kept draws after one untimed warm-up run
(NUTS ``max_tree_depth=6``, HMC 5 leapfrog steps, Langevin ``h = 0.01``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

import ebmcore
from ebm_samplers import HMCSampler, LangevinSampler, NUTSSampler

SAMPLERS = {
    "langevin": (LangevinSampler, {"step_size": 0.01}, 50),
    "hmc": (HMCSampler, {"step_size": 0.1, "n_leapfrog_steps": 5}, 20),
    "nuts": (NUTSSampler, {"max_tree_depth": 6}, 5),
}


def energy_of(name: str, d: int) -> ebmcore.EnergyModel:
    if name == "gaussian":
        return ebmcore.GaussianEnergy(torch.zeros(d), covariance=torch.eye(d))
    return ebmcore.energy(name, dim=d)


def best_time(name: str, algorithm: str, d: int, n_chains: int, fused: bool | None, repeats: int) -> tuple[float, str]:
    cls, kw, n_steps = SAMPLERS[algorithm]
    kw = dict(kw, step_size=0.5 * d**-0.25) if algorithm == "nuts" else kw
    sampler = cls(energy_of(name, d), fused=fused, **kw)
    x0 = torch.randn(n_chains, d, generator=torch.Generator().manual_seed(0))
    sampler.sample(x0, 1, generator=torch.Generator().manual_seed(1))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sampler.sample(x0, n_steps, generator=torch.Generator().manual_seed(1))
        times.append(time.perf_counter() - start)
    return min(times), sampler.prepare(x0, None, {}).path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=100)
    parser.add_argument("--dims", default="16,32,64,128")
    parser.add_argument("--energies", default="gaussian,double_well")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name in args.energies.split(","):
        for algorithm in SAMPLERS:
            for d in map(int, args.dims.split(",")):
                fused, path = best_time(name, algorithm, d, args.chains, True, args.repeats)
                per_step, _ = best_time(name, algorithm, d, args.chains, False, args.repeats)
                rows.append(
                    {
                        "energy": name,
                        "algorithm": algorithm,
                        "dim": d,
                        "chains": args.chains,
                        "fused_s": fused,
                        "per_step_s": per_step,
                        "per_step_over_fused": per_step / fused,
                    }
                )
                print(
                    f"{name:12s} {algorithm:8s} d={d:4d}: fused {fused * 1e3:9.1f} ms, per-step {per_step * 1e3:9.1f} ms, "
                    f"per-step/fused {per_step / fused:6.2f}",
                    flush=True,
                )
    meta = {
        "machine": platform.processor() or platform.machine(),
        "threads": 1,
        "load_average": os.getloadavg(),
        "torch": torch.__version__,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
