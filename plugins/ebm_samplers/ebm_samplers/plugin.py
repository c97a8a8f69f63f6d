"""Registers the samplers and integrators of ebm-samplers with ebmcore (entry point ``samplers``)."""

from __future__ import annotations

from ebmcore import hookimpl
from ebmcore.registry import Registrar

from ebm_samplers.chees import ChEESSampler
from ebm_samplers.hmc import HMCSampler
from ebm_samplers.integrators import DOPRI5, EulerMaruyama, Heun, Leapfrog, McLachlan, Yoshida
from ebm_samplers.langevin import LangevinSampler
from ebm_samplers.mala import MALASampler
from ebm_samplers.meads import MEADSSampler
from ebm_samplers.nuts import NUTSSampler
from ebm_samplers.annealed import AnnealedLangevinSampler
from ebm_samplers.tempering import ParallelTemperingSampler


@hookimpl
def ebm_register_samplers(registry: Registrar) -> None:
    for sampler in (LangevinSampler, MALASampler, HMCSampler, NUTSSampler, ChEESSampler, MEADSSampler, AnnealedLangevinSampler):
        registry.register_sampler(sampler.algorithm.name, sampler)
    registry.register_sampler("parallel_tempering", ParallelTemperingSampler)


@hookimpl
def ebm_register_integrators(registry: Registrar) -> None:
    for integrator in (EulerMaruyama, Leapfrog, McLachlan, Yoshida, Heun, DOPRI5):
        registry.register_integrator(integrator.name, integrator)


@hookimpl
def ebm_add_commands(subparsers) -> None:
    from ebm_samplers import profiling, sample_job

    sample_job.add_command(subparsers)
    profiling.add_command(subparsers)
