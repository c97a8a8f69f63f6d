"""Integrators: Euler–Maruyama (overdamped Langevin SDE), symplectic splittings (leapfrog, McLachlan,
Yoshida) for Hamiltonian dynamics, and Heun / DOPRI5 for ODEs such as the probability flow."""

from ebm_samplers.integrators.euler_maruyama import EulerMaruyama
from ebm_samplers.integrators.ode import DOPRI5, Heun, ODESolution
from ebm_samplers.integrators.splitting import Leapfrog, McLachlan, SplittingIntegrator, Yoshida
from ebm_samplers.integrators.resolve import resolve_integrator

__all__ = ["EulerMaruyama", "SplittingIntegrator", "Leapfrog", "McLachlan", "Yoshida", "Heun", "DOPRI5", "ODESolution", "resolve_integrator"]
