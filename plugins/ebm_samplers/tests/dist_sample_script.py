"""Run under torchrun by test_distributed.py: sample sharded chains and save what rank 0 sees."""

import sys

import torch

import ebmcore
from ebmcore import distributed
from ebm_samplers import LangevinSampler, MALASampler

mode, out = sys.argv[1], sys.argv[2]
run = distributed.init(timeout_s=20)
energy = ebmcore.energy("gaussian", mean=torch.tensor([1.0, -1.0, 0.5]), dim=3)
if mode == "fail" and run.rank == 1:
    raise RuntimeError("rank 1 fails on purpose")
if mode == "noise":  # identical starts: after one step the ranks must differ (distinct streams)
    res = distributed.sample(
        LangevinSampler(energy, step_size=0.5), 8 * run.world_size, 1, run, seed=7, x0=torch.zeros(8 * run.world_size, 3)
    )
else:
    res = distributed.sample(MALASampler(energy, step_size=0.6), 3001, 60, run, seed=7, burn_in=40, return_stats=True)
if run.is_main:
    torch.save(
        {
            "samples": res.samples,
            "trajectory": res.trajectory,
            "summary": res.summary,
            "acceptance": res.acceptance,
            "divergences": res.divergences,
            "stats": res.stats,
        },
        out,
    )
distributed.shutdown(run)
