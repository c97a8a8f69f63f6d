"""Distributed scaling of W2 (ULA on the 2-d double well, 50,000 chains, 1,000 steps, step 0.01):
the same total chains sharded over 1, 2 and 4 CPU processes (gloo), one thread each.

    benchmarks/.venv/bin/python benchmarks/scaling.py [--processes 1,2,4] [--repeats 3]

Each configuration is launched with torchrun; inside, the ranks synchronise, then the sampling of
their shards (and the gather of the final states on every rank) is timed; the median of the
repeats of the slowest rank is reported, with E[x²] of all chains as the correctness figure
(quadrature: 0.8327). Process start-up and imports are not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = r'''
import json, statistics, sys, time
import torch
import torch.distributed as dist
import ebmcore
from ebmcore import distributed
from ebm_samplers import LangevinSampler
torch.set_num_threads(1)
run = distributed.init(timeout_s=300)
energy = ebmcore.DoubleWellEnergy(dim=2)
sampler = LangevinSampler(energy, step_size=0.01)
times = []
for repeat in range(int(sys.argv[2]) + 1):
    if run.active:
        dist.barrier()
    start = time.perf_counter()
    result = distributed.sample(sampler, 50_000, 1_000, run, seed=repeat, return_trajectory=False)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    if run.active:
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if repeat:  # the first run is a warm-up
        times.append(float(elapsed))
if run.is_main:
    json.dump({"median_s": statistics.median(times), "times": times,
               "e_x2": float((result.samples.double() ** 2).mean())}, open(sys.argv[1], "w"))
distributed.shutdown(run)
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        worker = Path(tmp) / "worker.py"
        worker.write_text(WORKER)
        for n in [int(p) for p in args.processes.split(",")]:
            out = Path(tmp) / f"w2-{n}.json"
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    f"--nproc-per-node={n}",
                    str(worker),
                    str(out),
                    str(args.repeats),
                ],
                check=True,
                env=env,
                capture_output=True,
            )
            rows.append((n, json.loads(out.read_text())))
    base = rows[0][1]["median_s"]
    print(f"W2 sharded over CPU processes (gloo, 1 thread each, {os.cpu_count()} cores)")
    print("| processes | median (s) | speed-up vs 1 | efficiency | E[x²] (quadrature 0.8327) |")
    print("|---|---|---|---|---|")
    for n, r in rows:
        print(f"| {n} | {r['median_s']:.3f} | {base / r['median_s']:.2f} | {base / r['median_s'] / n:.0%} | {r['e_x2']:.4f} |")


if __name__ == "__main__":
    main()
