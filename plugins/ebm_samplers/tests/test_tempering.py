"""Parallel tempering: mixing between modes that a single chain cannot cross, and its validation."""

import math

import pytest
import torch

import ebmcore
from ebm_samplers import MALASampler, ParallelTemperingSampler
from ebmcore.errors import InputError

N = 2000


def _two_modes():
    return ebmcore.GaussianMixtureEnergy(means=[[-4.0, 0.0], [4.0, 0.0]], stds=0.5)


def test_parallel_tempering_mixes_modes_where_mala_stays():
    energy = _two_modes()
    x0 = torch.tensor([[-4.0, 0.0]]).repeat(N, 1)
    g = torch.Generator().manual_seed(0)
    mala = MALASampler(energy, step_size=0.2).sample(x0, 400, generator=g)
    swaps = []
    pt = ParallelTemperingSampler(energy, "mala", temperatures=[1.0, 3.0, 10.0, 30.0], base_options={"step_size": 0.2})
    result = pt.sample(
        x0, 400, generator=g, return_diagnostics=True, callback=lambda i, s, info: swaps.append(info.swap_accepted)
    )
    assert float((mala[:, 0] > 0).float().mean()) < 0.01  # MALA never leaves its mode
    right = float((result.samples[:, 0] > 0).float().mean())
    assert abs(right - 0.5) < 5 * math.sqrt(0.25 / N) + 0.02, f"PT occupancy of the right mode {right:.3f}"
    rates = torch.stack(swaps).float().mean((0, 2))
    assert rates.shape == (3,) and bool((rates > 0.2).all())
    assert result.diagnostics.acceptance_rate.shape == (N,) and result.samples.shape == (N, 2)


def test_parallel_tempering_validation():
    energy = _two_modes()
    with pytest.raises(InputError, match="must be ascending, start at 1"):
        ParallelTemperingSampler(energy, temperatures=[2.0, 3.0])
    with pytest.raises(InputError, match="on the same energy"):
        ParallelTemperingSampler(energy, base=MALASampler(ebmcore.energy("gaussian", dim=2)))
