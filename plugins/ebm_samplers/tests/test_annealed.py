"""Annealed Langevin: mode weights plain Langevin cannot recover, the schedule, and validation."""

import pytest
import torch

import ebmcore
from ebm_samplers import AnnealedLangevinSampler, geometric_sigmas
from ebmcore.errors import InputError

N = 2000


class SmoothedMixture(ebmcore.EnergyModel):
    """A noise-conditional energy: the mixture convolved with N(0, σ²I) (exact NCSN target)."""

    noise_conditional = True
    event_shape = (1,)

    def __init__(self, means, std, weights):
        super().__init__()
        self.means, self.std, self.log_w = torch.tensor(means), std, torch.tensor(weights).log()

    def compute_energy(self, x, sigma=None):
        s = torch.tensor(self.std) if sigma is None else torch.sqrt(self.std**2 + sigma[:, None] ** 2)
        z = (x - self.means) / s
        return -torch.logsumexp(self.log_w - 0.5 * z**2 - torch.log(s), dim=1)


def test_annealed_langevin_recovers_mode_weights_that_plain_langevin_cannot():
    energy = SmoothedMixture([-5.0, 5.0], 0.5, [0.2, 0.8])
    x0 = torch.empty(N, 1).uniform_(-8, 8, generator=torch.Generator().manual_seed(0))
    sigmas = geometric_sigmas(10.0, 0.5, 10)
    sampler = AnnealedLangevinSampler(energy, sigmas, n_steps_each=50, step_size=0.02)
    x = sampler.sample(x0, sampler.total_steps, generator=torch.Generator().manual_seed(1))
    right = float((x > 0).float().mean())
    assert abs(right - 0.8) < 0.04, f"annealed: right-mode weight {right:.3f} (true 0.8)"
    from ebm_samplers import LangevinSampler

    plain = LangevinSampler(energy, step_size=0.02).sample(x0, sampler.total_steps, generator=torch.Generator().manual_seed(1))
    assert abs(float((plain > 0).float().mean()) - 0.5) < 0.05  # stuck with the initial split


def test_annealed_langevin_schedule_and_validation():
    assert geometric_sigmas(1.0, 0.01, 3) == pytest.approx([1.0, 0.1, 0.01])
    energy = ebmcore.energy("gaussian", dim=2)
    levels = []
    AnnealedLangevinSampler(energy, [1.0, 0.5], n_steps_each=3).sample(
        torch.zeros(4, 2), 7, callback=lambda i, s, info: levels.append(info.level)
    )
    assert levels == [0, 0, 0, 1, 1, 1, 1]
    with pytest.raises(InputError, match="non-increasing"):
        AnnealedLangevinSampler(energy, [0.1, 1.0])
