"""Contract checks a third-party energy, sampler, loss or kernel backend runs against itself.

Each check raises ``AssertionError`` with a message naming the broken
property; call them from your own test suite::

    from ebmcore.testing import check_sampler
    def test_my_sampler_contract():
        check_sampler(lambda energy: MySampler(energy, step_size=0.1))
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterable

import torch
from torch import Tensor

from ebmcore.energies import EnergyModel, HarmonicEnergy, MLPEnergy
from ebmcore.energies.program import Analytic, FeedForward, Opaque
from ebmcore.errors import InputError
from ebmcore.kernels.base import KernelBackend
from ebmcore.kernels.fused import program_energy
from ebmcore.kernels.ops import sample_inputs
from ebmcore.kernels.torch_backend import TorchBackend, registered_analytic_energies

__all__ = ["check_energy", "check_program", "check_sampler", "check_loss", "check_kernel"]

_TOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def _close(actual: Tensor, expected: Tensor, rtol: float, what: str) -> None:
    scale = expected.abs().max().clamp_min(1.0)
    err = (actual.double() - expected.double()).abs().max()
    assert err <= rtol * scale, f"{what}: max abs error {float(err):.3g} exceeds {rtol:.1g} × {float(scale):.3g}"


def check_energy(energy: EnergyModel, x: Tensor, *, fd_step: float = 1e-6) -> None:
    """``energy`` on ``x: (n, *event_shape)``: shapes, dtype and device preserved; gradient equal to
    autograd and to central finite differences (computed on a float64 copy); ``score == -gradient``."""
    e = energy.energy(x)
    assert e.shape == (x.shape[0],), f"energy shape {tuple(e.shape)}, expected ({x.shape[0]},)"
    assert e.dtype == x.dtype and e.device == x.device, f"energy is {e.dtype} on {e.device}, input {x.dtype} on {x.device}"
    g = energy.gradient(x)
    assert g.shape == x.shape and g.dtype == x.dtype and g.device == x.device, "gradient must match x's shape, dtype, device"
    _close(energy.score(x), -g, 0.0, "score must equal -gradient")
    e2, g2 = energy.energy_and_gradient(x)
    _close(e2, e, _TOL[x.dtype], "energy_and_gradient energy")
    _close(g2, g, _TOL[x.dtype], "energy_and_gradient gradient")

    model = copy.deepcopy(energy).double()
    x64 = x.detach().double()
    xg = x64.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(model.compute_energy(xg).sum(), xg)
    _close(model.gradient(x64), auto, 1e-8, "gradient vs autograd (float64)")
    flat = x64.reshape(x64.shape[0], -1)
    fd = torch.empty_like(flat)
    for i in range(flat.shape[1]):
        step = torch.zeros_like(flat)
        step[:, i] = fd_step
        plus = model.compute_energy((flat + step).reshape(x64.shape))
        minus = model.compute_energy((flat - step).reshape(x64.shape))
        fd[:, i] = (plus - minus) / (2 * fd_step)
    _close(model.gradient(x64).reshape(flat.shape), fd, 1e-5, "gradient vs central finite differences (float64)")


def check_program(energy: EnergyModel, x: Tensor) -> None:
    """``energy.program()`` computes what ``energy.compute_energy`` does at ``x: (n, *event_shape)``, on a float64
    copy: the energy by the program's plain-torch reference, and for a feed-forward program the closed-form
    gradient the samplers bind against autograd's. For an energy that overrides ``program()``: run it in your
    tests. An :class:`~ebmcore.energies.program.Opaque` program passes (autograd runs the code itself)."""
    try:
        model = copy.deepcopy(energy).double()
    except RuntimeError as exc:  # torch's deepcopy of a non-leaf weight: the old weight_norm, pruning
        raise InputError(
            f"check_program copies {type(energy).__name__} to check it in float64, and torch cannot copy "
            f"it ({str(exc).splitlines()[0]}): a weight computed from others, as the old "
            "torch.nn.utils.weight_norm or torch.nn.utils.prune make. Use "
            "torch.nn.utils.parametrizations.weight_norm instead, or make pruning permanent with "
            "torch.nn.utils.prune.remove(module, 'weight'), before checking."
        ) from None
    x64 = x.detach().double()
    program = model.program()
    owner = type(energy).__name__
    lie = (
        f"{owner}.program() does not compute what {owner}.compute_energy does at these points: make program() "
        "describe exactly the modules compute_energy runs, or return Opaque(reason) (autograd then runs the code). "
    )
    if isinstance(program, (Opaque, Analytic)):  # analytic: the energy's own kernels are its program
        return
    with torch.no_grad():
        expected = model.compute_energy(x64)
        _close(
            program_energy(program, x64),
            expected,
            1e-10,
            f"{lie}The energy of {program.describe()}, its program, differs from compute_energy's",
        )
    if isinstance(program, FeedForward):
        fns = model.bind(x64)
        assert fns.program == program, f"bind() did not take the closed form: {fns.path}"
        e, g = fns.energy_and_gradient(x64)
        xg = x64.clone().requires_grad_(True)
        (auto,) = torch.autograd.grad(model.compute_energy(xg).sum(), xg)
        _close(e, expected, 1e-10, "closed-form energy vs compute_energy")
        _close(g, auto, 1e-9, "closed-form gradient vs autograd (float64)")


def check_sampler(
    factory: Callable[[EnergyModel], Any], *, dim: int = 2, n_chains: int = 2000, n_steps: int = 300, check_moments: bool = True
) -> None:
    """A sampler built by ``factory(energy)`` on a standard Gaussian: shape, dtype and device kept,
    reproducible for a seeded generator, the energy untouched, and (``check_moments``) mean within
    5 standard errors of 0 and variance within 20 % of 1 after ``n_steps``."""
    energy = HarmonicEnergy(dim=dim, dtype=torch.float64)
    sampler = factory(energy)
    x0 = torch.randn(n_chains, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    saved_x0 = x0.clone()
    saved_params = [t.clone() for t in (*energy.parameters(), *energy.buffers())]

    def run(seed: int) -> Tensor:
        g = torch.Generator().manual_seed(seed)
        state = sampler.init(x0)
        for _ in range(3):
            state, _ = sampler.step(state, generator=g)
        return state.x

    a, b = run(1), run(1)
    assert torch.equal(x0, saved_x0), "the sampler modified the caller's initial states in place"
    assert a.shape == x0.shape and a.dtype == x0.dtype and a.device == x0.device, "sampler changed shape/dtype/device"
    assert torch.isfinite(a).all(), "sampler produced non-finite states on a standard Gaussian"
    assert torch.equal(a, b), "same generator seed must give identical chains"
    assert not torch.equal(a, run(2)), "different seeds gave identical chains: the generator is ignored"
    assert energy.center.dtype == torch.float64, "the sampler re-typed the energy model"
    current = [*energy.parameters(), *energy.buffers()]
    assert all(torch.equal(p, q) for p, q in zip(current, saved_params)), "the sampler changed the energy's parameters"
    if check_moments:
        x = sampler.sample(x0, n_steps, generator=torch.Generator().manual_seed(3))
        assert torch.equal(x0, saved_x0), "sample() modified the caller's initial states in place"
        mean_err = float(x.mean(0).abs().max())
        assert mean_err < 5 / n_chains**0.5, f"sample mean off by {mean_err:.3f} (> 5 standard errors)"
        var = x.var(0)
        assert bool(((var - 1).abs() < 0.2).all()), f"sample variance {var.tolist()} not within 20% of 1"


def check_loss(factory: Callable[[], Any], *, dim: int = 2, batch: int = 128) -> None:
    """A loss built by ``factory()`` on an MLP energy: a finite scalar whose backward gives finite
    parameter gradients, not all zero, leaving the model's dtype alone."""
    energy = MLPEnergy(dim=dim, hidden=(16, 16), seed=0)
    data = torch.randn(batch, dim, generator=torch.Generator().manual_seed(0))
    loss = factory()
    value = loss(energy, data, generator=torch.Generator().manual_seed(1))
    assert isinstance(value, Tensor) and value.dim() == 0, f"loss must be a scalar tensor, got {value!r}"
    assert torch.isfinite(value), f"loss is not finite: {value}"
    value.backward()
    grads = [p.grad for p in energy.parameters() if p.grad is not None]  # score losses leave the output bias untouched
    assert all(torch.isfinite(g).all() for g in grads), "parameter gradients must be finite"
    assert any(bool(g.abs().sum() > 0) for g in grads), "all parameter gradients are zero"
    assert all(p.dtype == torch.float32 for p in energy.parameters()), "the loss re-typed the energy model"


def check_kernel(
    backend: KernelBackend,
    ops: Iterable[str] | None = None,
    *,
    device: Any = "cpu",
    dtypes: Iterable[torch.dtype] = (torch.float32, torch.float64),
    n: int = 64,
    d: int = 4,
) -> list[str]:
    """Every kernel of ``backend`` (or ``ops``) that can run on ``device`` agrees with the ``torch``
    reference on the op's sample inputs (the builtin ops, and the ops of analytic energies registered in
    the plugin session). Returns the ``op[dtype]`` pairs checked (asserting at least one)."""
    reference = TorchBackend().kernels
    dev = torch.device(device)
    checked = []
    for op in ops or sorted(backend.kernels):
        if op not in reference:  # an op of an analytic energy a plugin registers, if any
            reference = TorchBackend(registered=registered_analytic_energies).kernels
        if op not in reference:
            raise AssertionError(
                f"op {op!r} has no torch reference (neither in ebmcore.kernels.ops nor declared by a registered "
                "analytic energy); compare it yourself"
            )
        kernel = backend.kernels[op]
        for dtype in dtypes:
            capability = tuple(torch.cuda.get_device_capability(dev)) if dev.type == "cuda" else None
            if backend.unavailable_reason() or kernel.mismatch(dev, dtype, capability):
                continue
            args = sample_inputs(op, n, d, dtype=dtype, device=dev)
            expected = reference[op].fn(*sample_inputs(op, n, d, dtype=torch.float64))
            actual = kernel.fn(*args)
            assert actual.shape == expected.shape and actual.dtype == dtype, (
                f"{op}[{dtype}] returned {actual.shape} {actual.dtype}"
            )
            name = f"{op}[{str(dtype).removeprefix('torch.')}]"
            _close(actual.cpu(), expected, _TOL[dtype] * 10, f"{backend.name}.{name} vs torch reference")
            checked.append(name)
    assert checked, f"backend {backend.name!r} could run none of its kernels on {device} with {list(dtypes)}"
    return checked
