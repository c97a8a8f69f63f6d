"""Integrators: reversibility, orders of accuracy, gradient-evaluation counts, ODE accuracy."""

import math

import pytest
import torch

import ebmcore
from ebm_samplers import DOPRI5, Heun, Leapfrog, McLachlan, Yoshida, hmc
from ebm_samplers.integrators import EulerMaruyama, resolve_integrator
from ebm_samplers.params import IDENTITY
from ebmcore.errors import InputError
from sampler_problems import correlated_gaussian

SPLITTINGS = [Leapfrog(), McLachlan(), Yoshida()]


def _state(energy, n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g, dtype=torch.float64)
    p = torch.randn(n, 10, generator=g, dtype=torch.float64)
    return x, p


def _hamiltonian(energy, x, p):
    return energy.energy(x) + 0.5 * (p * p).sum(-1)


def test_registered_names():
    assert set(ebmcore.registry.names("integrator")) >= {"euler_maruyama", "leapfrog", "mclachlan", "yoshida", "heun", "dopri5"}
    assert ebmcore.registry.get("integrator", "leapfrog").distribution == "ebm-samplers"


@pytest.mark.parametrize("integrator", SPLITTINGS, ids=lambda i: i.name)
def test_splittings_are_time_reversible(integrator):
    energy = correlated_gaussian()
    fns = energy.bind(torch.zeros(1, 10, dtype=torch.float64))
    x0, p0 = _state(energy)
    x, p, _, grad = integrator.integrate(x0.clone(), p0.clone(), fns.gradient(x0), fns, 0.1, 20, IDENTITY)
    xb, pb, _, _ = integrator.integrate(x.clone(), -p, grad, fns, 0.1, 20, IDENTITY)
    torch.testing.assert_close(xb, x0, rtol=0, atol=1e-10)
    torch.testing.assert_close(-pb, p0, rtol=0, atol=1e-10)


@pytest.mark.parametrize("integrator", SPLITTINGS, ids=lambda i: i.name)
def test_energy_error_has_the_declared_order(integrator):
    """|ΔH| over a fixed time shrinks like h^order: halving h divides it by 2^order."""
    energy = ebmcore.energy("double_well", dim=10, barrier=0.25)
    fns = energy.bind(torch.zeros(1, 10, dtype=torch.float64))
    x0, p0 = _state(energy, n=256, seed=1)
    h0 = _hamiltonian(energy, x0, p0)

    def error(h):
        n = round(1.0 / h)
        x, p, _, _ = integrator.integrate(x0.clone(), p0.clone(), fns.gradient(x0), fns, h, n, IDENTITY)
        return (_hamiltonian(energy, x, p) - h0).abs().mean().item()

    ratio = error(0.02) / error(0.01)
    assert abs(math.log2(ratio) - integrator.order) < 0.3, f"observed order {math.log2(ratio):.2f}, declared {integrator.order}"


def test_leapfrog_costs_l_plus_one_gradients_per_trajectory():
    energy = correlated_gaussian()
    calls = {"gradient": 0, "energy_and_gradient": 0}
    base = energy.bind(torch.zeros(1, 10, dtype=torch.float64))

    def count(name, fn):
        def wrapped(x):
            calls[name] += 1
            return fn(x)

        return wrapped

    fns = ebmcore.EnergyFunctions(
        base.energy, count("gradient", base.gradient), count("energy_and_gradient", base.energy_and_gradient)
    )
    x0, _ = _state(energy)
    state = hmc.init(x0, fns)
    assert calls == {"gradient": 0, "energy_and_gradient": 1}
    step = hmc.build_kernel()
    state, info = step(state, fns, torch.Generator().manual_seed(0), hmc.Params(step_size=0.1, n_leapfrog_steps=7).resolve(x0))
    assert calls["gradient"] + calls["energy_and_gradient"] == 7 + 1
    assert info.n_gradient_evaluations == 7


def test_mclachlan_beats_leapfrog_at_equal_cost():
    energy = correlated_gaussian()
    fns = energy.bind(torch.zeros(1, 10, dtype=torch.float64))
    x0, p0 = _state(energy, n=256)
    h0 = _hamiltonian(energy, x0, p0)
    errs = {}
    for integ, h, n in ((Leapfrog(), 0.05, 40), (McLachlan(), 0.1, 20)):  # 40 gradients each, same time
        x, p, _, _ = integ.integrate(x0.clone(), p0.clone(), fns.gradient(x0), fns, h, n, IDENTITY)
        errs[integ.name] = (_hamiltonian(energy, x, p) - h0).abs().mean().item()
    assert errs["mclachlan"] < errs["leapfrog"] / 2


def test_euler_maruyama_step_formula():
    x = torch.randn(5, 3, dtype=torch.float64)
    grad, noise = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    new = EulerMaruyama().bind(x)(x, grad, noise, 0.1, math.sqrt(0.2))
    torch.testing.assert_close(new, x - 0.1 * grad + math.sqrt(0.2) * noise)


def _linear_field():
    a = torch.tensor([[-0.1, 1.0], [-1.0, -0.1]], dtype=torch.float64)
    return a, (lambda t, x: x @ a.T)


@pytest.mark.parametrize("rtol", [1e-5, 1e-8])
def test_dopri5_meets_the_requested_tolerance(rtol):
    a, f = _linear_field()
    x0 = torch.randn(32, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    exact = x0 @ torch.linalg.matrix_exp(5.0 * a).T
    sol = DOPRI5().solve(f, x0, 0.0, 5.0, rtol=rtol, atol=rtol * 1e-2)
    err = ((sol.x - exact).abs() / (rtol * 1e-2 + rtol * exact.abs())).max().item()
    assert err < 20, f"error {err:.1f}× the tolerance"  # global error accumulates over the steps
    assert sol.n_steps > 5 and sol.n_evaluations == 1 + 6 * (sol.n_steps + sol.n_rejected)


def test_dopri5_integrates_backwards_and_adapts():
    a, f = _linear_field()
    x0 = torch.randn(8, 2, dtype=torch.float64)
    loose = DOPRI5().solve(f, x0, 2.0, 0.0, rtol=1e-4, atol=1e-6)
    tight = DOPRI5().solve(f, x0, 2.0, 0.0, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(tight.x, x0 @ torch.linalg.matrix_exp(-2.0 * a).T, rtol=1e-7, atol=1e-9)
    assert tight.n_steps > loose.n_steps


def test_heun_is_second_order():
    a, f = _linear_field()
    x0 = torch.randn(8, 2, dtype=torch.float64)
    exact = x0 @ torch.linalg.matrix_exp(1.0 * a).T
    e1 = (Heun().solve(f, x0, 0.0, 1.0, n_steps=20).x - exact).abs().max()
    e2 = (Heun().solve(f, x0, 0.0, 1.0, n_steps=40).x - exact).abs().max()
    assert abs(math.log2(e1 / e2) - 2) < 0.2


def test_integrators_of_the_wrong_kind_are_refused():
    with pytest.raises(InputError, match="integrator 'heun' integrates ode dynamics but HMCSampler needs a hamiltonian"):
        resolve_integrator("heun", kind="hamiltonian", symplectic=True, user="HMCSampler")
    with pytest.raises(InputError, match="needs a sde integrator"):
        resolve_integrator(Leapfrog(), kind="sde", user="LangevinSampler")
    with pytest.raises(InputError, match="registered name or an ebmcore.Integrator"):
        resolve_integrator(3, kind="sde", user="LangevinSampler")
    with pytest.raises(InputError, match="n_steps must be a positive integer"):
        Heun().solve(lambda t, x: x, torch.zeros(1, 1), 0.0, 1.0, n_steps=0)


def test_dopri5_rejects_bad_steps():
    with pytest.raises(InputError, match="first_step must be a finite positive"):
        DOPRI5().solve(lambda t, x: torch.ones_like(x), torch.zeros(1, 1), 0.0, 1.0, first_step=-0.1)
    with pytest.raises(InputError, match="max_steps"):
        DOPRI5().solve(lambda t, x: torch.ones_like(x), torch.zeros(1, 1), 0.0, 1.0, max_steps=0)
