#!/usr/bin/env python
"""Benchmark harness: the fixed workloads of WORKLOADS.md for ``ebm``, ``torchebm`` and ``blackjax``.

    benchmarks/.venv/bin/python benchmarks/run.py [--workloads W1,W3] [--libs ebm,torchebm]
        [--repeats 5] [--threads 1] [--json PATH] [--quick]

Every (workload, library) pair gets the same seeded float32 initial states ``x0 ~ N(0, I)`` and
the same target; one warm-up run (for JAX this includes the jit compile), one untimed correctness
run, then ``--repeats`` timed runs, interleaved (for each repeat, every library in turn). Tables
report the median; the ratio columns are each library's median over ebm's (> 1: ebm is faster).
ebm is measured in two variants in the same interleaved run wherever a sampler runs (W1-W4, S4, S7,
S8): ``ebm`` (the default, ``fused=None``: one fused multi-step chain kernel per run where a backend
provides one at a positive priority, e.g. ebm-cuda's ``cpu_fused`` Langevin chains; noise from an
in-kernel Philox stream) and ``ebm-step`` (``fused=False``: the per-step loop, noise from the
``torch.Generator``); both ratios (peer / ebm and peer / ebm-step) are reported. torchebm draws
the same ``torch.Generator`` noise as ``ebm-step``, so its samples are compared with ebm-step's;
every sampler is also held to the law it should sample (for the Gaussians and the double well,
z-scores of the sample moments against the exact law after the run's steps; see ``figures``),
which needs no shared noise. S1/S2 time the functional single step (``ebm``) and the object API
one step per call (``ebm:sample1``, default; ``ebm-step:sample1``, ``fused=False``).
W5-W7 (training losses: ebm_losses vs torchebm.losses; BlackJAX has none) train the seeded MLP on a
fixed seeded eight-Gaussians batch and report the loss and its parameter gradient beside the time.
W8 (NUTS: ebm vs BlackJAX; torchebm has none) reports the bulk ESS of the kept trajectory per second
beside the time, with both libraries' trajectories diagnosed by the same ``ebmcore.diagnostics``.
W3C and W9 (issue 43: ChEES-HMC, ebm's ``chees_warmup`` + ``ChEESSampler`` vs BlackJAX's ``chees_adaptation`` +
``dynamic_hmc``) time the warm-up and the sampling separately and report ESS per second and per gradient.
No timing is ever asserted. See benchmarks/README.md for how each peer is called.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

LIBS = ("ebm", "ebm-step", "ebm-bf16", "torchebm", "blackjax")
BF16_KINDS = ("langevin", "cd", "ssm", "dsm")  # ebm-bf16: the MLP workloads (W4-W7) under autocast=torch.bfloat16
EBM_VARIANTS = ("ebm", "ebm-step")  # fused=None (the default) and fused=False
Z_TOL = 5.0  # a moment z-score beyond this (in absolute value) fails the correctness check
ENERGY_TOL = 1e-6  # a peer's energy or gradient further than this from ebm's (see energy_check) fails the check
SEED_X0 = 0  # initial states
SEED_NOISE = 1  # sampler randomness (torch.Generator / jax PRNGKey)
SEED_COV = 2  # W1's covariance
SEED_MLP = 3  # W4's MLP weights (also W5-W7's initial weights)
SEED_DATA = 4  # W5-W7's data batch (eight Gaussians)
SEED_LOGISTIC = 5  # W9's synthetic logistic-regression dataset


# ----------------------------------------------------------------------------------------------
# Workloads
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """One benchmark problem. ``kind``: ``langevin``/``hmc`` (a full run of ``n_steps``),
    ``langevin_step``/``hmc_step`` (single transitions, ``inner`` of them per timed run, reported per step),
    ``nuts`` (a full NUTS run of ``n_steps`` iterations with a fixed ``step_size`` and ``max_tree_depth``,
    identity mass, keeping the trajectory; reported with its ESS per second),
    or a training loss (``LOSS_KINDS``: ``cd`` = one CD-``n_steps`` training step with Adam ``lr``;
    ``ssm``/``dsm`` = sliced/denoising score matching forward + backward; ``inner`` successive calls per
    timed run, reported per call; ``n_chains`` is then the batch size).
    ``target``: ``gaussian`` (W1's full-covariance Gaussian), ``standard`` (N(0, I)),
    ``double_well`` or ``mlp``."""

    id: str
    what: str
    kind: str
    target: str
    dim: int
    n_chains: int
    n_steps: int
    step_size: float
    n_leapfrog: int = 0
    inner: int = 1
    guide: str = ""  # the performance guides' CPU figure
    guide_rate: float = 0.0  # samples/s the guides quote (S7, S8)
    lr: float = 0.0  # W5: Adam's learning rate
    n_projections: int = 0  # W6
    projection: str = ""  # W6: the projection distribution (both libraries draw it with randn: "gaussian")
    sigma: float = 0.0  # W7: the noise level
    max_tree_depth: int = 0  # W8: NUTS trajectories have at most 2^max_tree_depth - 1 leapfrog steps
    n_warmup: int = 0  # W3C, W9 (ChEES): adaptation iterations before the n_steps kept ones
    n_rows: int = 0  # W9: rows of the logistic-regression dataset


WORKLOADS: dict[str, Workload] = {
    w.id: w
    for w in [
        Workload("W1", "Langevin (ULA), 10-d Gaussian, full covariance", "langevin", "gaussian", 10, 10_000, 100, 0.01),
        Workload("W2", "Langevin (ULA), 2-d double well", "langevin", "double_well", 2, 50_000, 1_000, 0.01),
        Workload("W3", "HMC, 20-d standard Gaussian", "hmc", "standard", 20, 1_000, 100, 0.1, n_leapfrog=10),
        Workload("W4", "Langevin (ULA), MLP energy 2-64-64-1 SiLU", "langevin", "mlp", 2, 10_000, 100, 0.01),
        Workload(
            "W5",
            "one contrastive-divergence training step (CD-10 with Langevin negatives, backward, Adam), MLP energy 2-64-64-1 SiLU",
            "cd",
            "mlp",
            2,
            1_024,
            10,
            0.01,
            inner=20,
            lr=1e-3,
        ),
        Workload(
            "W6",
            "sliced score matching loss, forward + backward, MLP energy 2-64-64-1 SiLU",
            "ssm",
            "mlp",
            2,
            1_024,
            0,
            0.0,
            inner=50,
            n_projections=1,
            projection="gaussian",
        ),
        Workload(
            "W7",
            "denoising score matching loss, forward + backward, MLP energy 2-64-64-1 SiLU",
            "dsm",
            "mlp",
            2,
            1_024,
            0,
            0.0,
            inner=50,
            sigma=0.1,
        ),
        Workload("W8", "NUTS, 20-d standard Gaussian", "nuts", "standard", 20, 100, 200, 0.5, max_tree_depth=10),
        Workload(
            "W8K",
            "NUTS, 20-d standard Gaussian, 1,000 chains (W8 at 10x the chains)",
            "nuts",
            "standard",
            20,
            1_000,
            200,
            0.5,
            max_tree_depth=10,
        ),
        Workload(  # issue 43: ChEES-HMC against BlackJAX's chees_adaptation + dynamic_hmc (step_size: where both start)
            "W3C",
            "ChEES-HMC, 20-d standard Gaussian (W3's target), 1,024 chains",
            "chees",
            "standard",
            20,
            1_024,
            200,
            0.5 * 20**-0.25,
            n_warmup=200,
        ),
        Workload(  # issue 43
            "W9",
            "ChEES-HMC, Bayesian logistic regression, 100 features, 1,000 rows, N(0, I) prior, 1,024 chains",
            "chees",
            "logistic",
            100,
            1_024,
            200,
            0.5 * 100**-0.25,
            n_warmup=200,
            n_rows=1_000,
        ),
        Workload(
            "S1",
            "one Langevin step, 1,000 chains, dim 10 (W1's Gaussian)",
            "langevin_step",
            "gaussian",
            10,
            1_000,
            1,
            0.01,
            inner=200,
            guide="8.2 ms CPU",
        ),
        Workload(
            "S2",
            "one HMC step, 1,000 chains, dim 10 (standard Gaussian, step 0.1, 10 leapfrog)",
            "hmc_step",
            "standard",
            10,
            1_000,
            1,
            0.1,
            n_leapfrog=10,
            inner=50,
            guide="15.4 ms CPU",
        ),
        Workload(
            "S4",
            "full Langevin sampling, 10,000 chains, 100 steps, dim 10 (W1's Gaussian)",
            "langevin",
            "gaussian",
            10,
            10_000,
            100,
            0.01,
            guide="820 ms CPU",
        ),
        Workload(
            "S7",
            "Langevin sampling, dim 20 standard Gaussian, 100 chains, 200 steps",
            "langevin",
            "standard",
            20,
            100,
            200,
            0.01,
            guide="270 K samples/s",
            guide_rate=270e3,
        ),
        Workload(
            "S8",
            "HMC sampling, dim 20 standard Gaussian, 50 chains, 100 steps, 10 leapfrog",
            "hmc",
            "standard",
            20,
            50,
            100,
            0.1,
            n_leapfrog=10,
            guide="7 K samples/s",
            guide_rate=7e3,
        ),
    ]
}

BLACKJAX_KINDS = ("langevin", "hmc", "nuts")  # blackjax has no single-step workloads here (S1, S2), and no EBM losses (W5-W7)
TORCHEBM_KINDS = ("langevin", "hmc", "langevin_step", "hmc_step", "cd", "ssm", "dsm")  # torchebm has no NUTS (W8)
NUTS_ESS_SEEDS = (1, 2, 3, 4, 5)  # W8: untimed extra runs (seed 1 is the timed one) showing the seed-to-seed spread of the ESS
LOSS_KINDS = ("cd", "ssm", "dsm")


def per_call(w: Workload) -> int:
    """How many steps/loss calls one timed run makes (its time is reported divided by this)."""
    return w.inner if (w.kind.endswith("_step") or w.kind in LOSS_KINDS) else 1


def quick(w: Workload) -> Workload:
    """Tiny sizes for smoke tests."""
    return replace(
        w, n_chains=min(w.n_chains, 256), n_steps=min(w.n_steps, 10), inner=min(w.inner, 5), n_warmup=min(w.n_warmup, 10)
    )


# ----------------------------------------------------------------------------------------------
# Shared problem data (identical for every library)
# ----------------------------------------------------------------------------------------------


def gaussian_covariance(dim: int, seed: int = SEED_COV) -> np.ndarray:
    """W1's covariance: ``Q diag(eigs) Q^T`` with ``Q`` the orthogonal factor of a seeded standard
    normal matrix (signs fixed by ``diag(R) > 0``) and eigenvalues geometrically spaced in [0.5, 2].
    Symmetrised and returned in float64; every library gets it cast to float32."""
    rng = np.random.default_rng(seed)
    q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
    q = q * np.sign(np.diag(r))
    eigs = np.geomspace(0.5, 2.0, dim)
    cov = (q * eigs) @ q.T
    return 0.5 * (cov + cov.T)


def make_x0(n_chains: int, dim: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(SEED_X0)
    return torch.randn(n_chains, dim, generator=g, dtype=torch.float32)


def make_eight_gaussians(n: int, seed: int = SEED_DATA) -> Any:
    """W5-W7's data batch: a uniform mixture of eight Gaussians (std 0.2) centred on the circle of radius 2
    (the defaults of ``ebm_losses.datasets.make_eight_gaussians``, written out here so that the batch does not
    depend on either library); float64 draws from a seeded ``torch.Generator``, returned as float32."""
    import torch

    g = torch.Generator().manual_seed(seed)
    angles = torch.arange(8, dtype=torch.float64) * (torch.pi / 4)
    centres = 2.0 * torch.stack([angles.cos(), angles.sin()], 1)
    which = torch.randint(0, 8, (n,), generator=g)
    return (centres[which] + 0.2 * torch.randn(n, 2, generator=g, dtype=torch.float64)).to(torch.float32)


def make_mlp(seed: int = SEED_MLP) -> Any:
    """The shared ``2 -> 64 -> 64 -> 1`` SiLU MLP; weights ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` from a seeded generator."""
    import torch
    from torch import nn

    net = nn.Sequential(nn.Linear(2, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 1))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in net:
            if isinstance(layer, nn.Linear):
                bound = layer.in_features**-0.5
                for p in (layer.weight, layer.bias):
                    p.copy_((torch.rand(p.shape, generator=g, dtype=torch.float64) * 2 - 1) * bound)
    return net


def make_logistic_data(dim: int, rows: int, seed: int = SEED_LOGISTIC) -> tuple[np.ndarray, np.ndarray]:
    """W9's dataset: features ``X: (rows, dim)`` i.i.d. ``N(0, 1/dim)`` (so that ``x·β`` is of order 1 under the prior),
    labels ``y ~ Bernoulli(sigmoid(X β*))`` for ``β* ~ N(0, I)``, all from ``numpy.random.default_rng(seed)``; float32.
    The posterior under the ``N(0, I)`` prior has scales of about 0.5-0.7 (no direction is left to the prior alone)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, dim)) / np.sqrt(dim)
    beta = rng.standard_normal(dim)
    y = (rng.random(rows) < 1.0 / (1.0 + np.exp(-x @ beta))).astype(np.float64)
    return x.astype(np.float32), y.astype(np.float32)


@dataclass
class Problem:
    """What every library's runner receives: the workload, ``x0`` (torch float32) and the target's data.
    For the losses (W5-W7) ``x0`` is the data batch and ``net`` is trainable; ``net_init`` holds its
    initial parameters, restored before every timed run (``restore_net``)."""

    w: Workload
    x0: Any
    mean: np.ndarray  # true mean (gaussian/standard)
    cov: np.ndarray  # true covariance (gaussian/standard)
    net: Any = None  # the torch MLP (mlp)
    net_init: Any = None  # W5-W7: a copy of the MLP's initial state_dict
    data: tuple[np.ndarray, np.ndarray] | None = None  # W9: the logistic regression's (X, y), float32


def make_problem(w: Workload) -> Problem:
    cov = gaussian_covariance(w.dim) if w.target == "gaussian" else np.eye(w.dim)
    net = make_mlp() if w.target == "mlp" else None
    if w.kind in LOSS_KINDS:  # the losses train the MLP: parameters stay trainable
        init = {k: v.detach().clone() for k, v in net.state_dict().items()}
        return Problem(w, make_eight_gaussians(w.n_chains), np.zeros(w.dim), cov, net, init)
    if net is not None:
        net.requires_grad_(False)  # the sampler differentiates w.r.t. x only
    data = make_logistic_data(w.dim, w.n_rows) if w.target == "logistic" else None
    return Problem(w, make_x0(w.n_chains, w.dim), np.zeros(w.dim), cov, net, data=data)


def restore_net(p: Problem) -> None:
    """Put the shared MLP back to its initial parameters, gradients unset (untimed, before every run)."""
    import torch

    with torch.no_grad():
        for name, t in p.net.state_dict().items():
            t.copy_(p.net_init[name])
    p.net.zero_grad(set_to_none=True)


# ----------------------------------------------------------------------------------------------
# A case = what one library does for one workload
# ----------------------------------------------------------------------------------------------


@dataclass
class Case:
    """``run()``: the timed call (blocks until the result exists). ``check()``: an untimed run with the
    same seed returning ``{"samples": ndarray, "acceptance": float | None}`` for the correctness figures
    (for the losses: see ``loss_case``). ``reset()``: untimed, before every warm-up, check and timed run.
    ``path``: for ebm's samplers, the code path taken (fused chain kernel or per-step loop, and why).
    ``energy(x)``: for a peer, its own energy and gradient (what its timed run evaluates) at a torch ``x``,
    as float64 arrays ``(n,)`` and ``(n, d)``, untimed; ``energy_check`` holds them to ebm's."""

    run: Callable[[], Any]
    check: Callable[[], dict]
    reset: Callable[[], None] = lambda: None
    path: str = ""
    energy: Callable[[Any], tuple[np.ndarray, np.ndarray]] | None = None  # a peer's own E(x), grad E(x) (see energy_check)


def error_text(exc: BaseException) -> str:
    """An exception as a results row gives it: its type and the first line of its message (300 characters at most)."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"


def relative_differences(loss: float, grads: Any, reference: tuple[float, Any], against: str) -> dict:
    """A training step's loss and flattened gradient (a tensor) against ``reference = (loss, grads)``'s, as relative
    differences: ``{"loss_rel_diff_vs_<against>", "grad_rel_diff_vs_<against>"}``."""
    ref_loss, ref_grads = reference
    return {
        f"loss_rel_diff_vs_{against}": abs(loss - ref_loss) / max(abs(ref_loss), 1e-30),
        f"grad_rel_diff_vs_{against}": float((grads - ref_grads).norm() / ref_grads.norm().clamp_min(1e-30)),
    }


def _np(x: Any) -> np.ndarray:
    return np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x, dtype=np.float64)


def energy_check(p: Problem, peer: Callable[[Any], tuple[np.ndarray, np.ndarray]]) -> dict:
    """A peer's energy and gradient against ebm's on the same points and weights: ``peer(x)`` is the peer's own
    energy and gradient functions (those its timed run calls, float32, each library's own arithmetic) at every
    row of ``x0`` (for W5-W7 the data batch), ebm's are ``ebm_energy(p).energy_and_gradient``. The difference
    of each entry is scaled by ``max(1, |ebm's value|)`` (relative for large values, absolute near zero) and
    the largest is reported; ``energy_ok``: both within ``ENERGY_TOL``. A peer timed on another energy than
    ebm's (another parameterisation, dtype or weights) would fail here, whatever its samples look like."""
    x = p.x0.detach()
    e_ref, g_ref = ebm_energy(p).energy_and_gradient(x)
    e_ref, g_ref = _np(e_ref), _np(g_ref)
    e, g = peer(x)

    def scaled(a: np.ndarray, ref: np.ndarray) -> float:
        a = np.asarray(a, dtype=np.float64).reshape(ref.shape)
        return float((np.abs(a - ref) / np.maximum(1.0, np.abs(ref))).max())

    out = {"energy_diff_vs_ebm": scaled(e, e_ref), "grad_diff_vs_ebm": scaled(g, g_ref)}
    out["energy_ok"] = bool(max(out.values()) <= ENERGY_TOL)
    return out


# -- ebm ---------------------------------------------------------------------------------------


def ebm_energy(p: Problem) -> Any:
    import torch

    import ebmcore

    t = p.w.target
    if t == "gaussian":
        return ebmcore.GaussianEnergy(torch.zeros(p.w.dim), covariance=torch.tensor(p.cov, dtype=torch.float32))
    if t == "standard":
        return ebmcore.HarmonicEnergy(dim=p.w.dim)
    if t == "double_well":
        return ebmcore.DoubleWellEnergy(dim=p.w.dim)
    if t == "mlp":
        return net_energy(p.net)
    if t == "logistic":
        return logistic_energy(*p.data)
    raise ValueError(t)


def logistic_energy(x: np.ndarray, y: np.ndarray) -> Any:
    """W9's energy as an ebm user writes it: an ``EnergyModel`` whose ``compute_energy(β)`` is the negative log
    posterior ``½‖β‖² + Σ_i softplus(x_i·β) − y_i x_i·β`` for a batch ``β: (n, d)``; its gradient is autograd's."""
    import torch
    import torch.nn.functional as F

    import ebmcore

    class LogisticRegressionEnergy(ebmcore.EnergyModel):
        def __init__(self, x: Any, y: Any) -> None:
            super().__init__()
            self.event_shape = (x.shape[1],)
            self.register_buffer("x", x)
            self.register_buffer("y", y)

        def compute_energy(self, beta: Any) -> Any:
            logits = beta @ self.x.T  # (n, rows)
            return 0.5 * beta.square().sum(1) + (F.softplus(logits) - self.y * logits).sum(1)

    return LogisticRegressionEnergy(torch.from_numpy(x), torch.from_numpy(y))


def net_energy(net: Any) -> Any:
    """The shared MLP ``net`` (from :func:`make_mlp`) as an ebm energy, ``E(x) = net(x)``, ``x: (n, 2)``."""
    import ebmcore

    return ebmcore.SequentialEnergy(net, event_shape=(2,))


def ebm_path(sampler: Any, x: Any) -> str:
    """Which path ``sampler.sample(x, ...)`` takes: the fused chain kernel (op and backend) or the per-step loop (why)."""
    import ebmcore

    run = sampler.prepare(x, None, {})
    if run.chain is None or run.path.startswith("fused chain ") and "_chain " in run.path:  # the path names its kernel
        return run.path
    op = f"{sampler.energy.op}_{sampler.algorithm.name}_chain" if hasattr(sampler.energy, "op") else "feedforward_langevin_chain"
    if run.path.startswith("fused chain ("):  # the path names the backend and its products itself
        return run.path.replace("fused chain", f"fused chain {op}", 1)
    chosen = ebmcore.explain(op, x, backend=getattr(sampler.energy, "backend", None)).chosen
    return run.path.replace("fused chain", f"fused chain {op} ({chosen.backend if chosen else '?'})", 1)


def ebm_sampling(p: Problem, fused: bool | None = None, autocast: Any = None, precision: str | None = None) -> Case:
    """W1-W4, S4, S7, S8: the object API, ``Sampler(..., fused=fused).sample(x0, n_steps, generator=g)``
    (``fused=None``: the library's default, a fused chain where one is available; ``False``: the per-step loop;
    ``autocast``: the energy evaluated under ``torch.autocast`` in that dtype; ``precision``: the fused chain's
    products, ``"bf16"`` for W4's ``ebm-bf16``)."""
    import torch
    from ebm_samplers import HMCSampler, LangevinSampler

    w, energy = p.w, ebm_energy(p)
    if w.kind == "langevin":
        sampler = LangevinSampler(energy, step_size=w.step_size, fused=fused, autocast=autocast, precision=precision)
    else:
        sampler = HMCSampler(energy, step_size=w.step_size, n_leapfrog_steps=w.n_leapfrog, fused=fused)
    path = ebm_path(sampler, p.x0)

    def run() -> Any:
        return sampler.sample(p.x0, w.n_steps, generator=torch.Generator().manual_seed(SEED_NOISE))

    def check() -> dict:
        g = torch.Generator().manual_seed(SEED_NOISE)
        if w.kind == "langevin":
            return {"samples": _np(sampler.sample(p.x0, w.n_steps, generator=g)), "acceptance": None}
        res = sampler.sample(p.x0, w.n_steps, generator=g, return_diagnostics=True)
        return {"samples": _np(res.samples), "acceptance": float(res.diagnostics.acceptance_rate.mean())}

    return Case(run, check, path=path)


def ebm_single_step(p: Problem) -> Case:
    """S1, S2: the functional API, ``step = langevin.build_kernel()`` / ``hmc.build_kernel()`` with
    ``fns = energy.bind(x0)`` and resolved params; one timed run is ``inner`` successive steps from the same state."""
    import torch
    from ebm_samplers import hmc, langevin

    w, energy = p.w, ebm_energy(p)
    fns = energy.bind(p.x0)
    if w.kind == "langevin_step":
        mod, params = langevin, langevin.Params(step_size=w.step_size)
    else:
        mod, params = hmc, hmc.Params(step_size=w.step_size, n_leapfrog_steps=w.n_leapfrog)
    state0, step, params = mod.init(p.x0, fns), mod.build_kernel(), params.resolve(p.x0)

    def steps(n: int) -> tuple[Any, list]:
        g = torch.Generator().manual_seed(SEED_NOISE)
        state, infos = state0, []
        for _ in range(n):
            state, info = step(state, fns, g, params)
            infos.append(info)
        return state, infos

    def run() -> Any:
        return steps(w.inner)

    def check() -> dict:
        state, infos = steps(1)
        acc = float(infos[0].accepted.float().mean()) if hasattr(infos[0], "accepted") else None
        return {"samples": _np(state.x), "acceptance": acc}

    return Case(run, check)


def ebm_single_step_object(p: Problem, fused: bool | None = None) -> Case:
    """S1, S2 through the object API: ``sample(x, n_steps=1)`` called ``inner`` times (per-call overhead included);
    ``fused=None`` (``ebm:sample1``): a one-step fused chain call where available; ``False`` (``ebm-step:sample1``)."""
    import torch
    from ebm_samplers import HMCSampler, LangevinSampler

    w, energy = p.w, ebm_energy(p)
    if w.kind == "langevin_step":
        sampler = LangevinSampler(energy, step_size=w.step_size, fused=fused)
    else:
        sampler = HMCSampler(energy, step_size=w.step_size, n_leapfrog_steps=w.n_leapfrog, fused=fused)
    path = ebm_path(sampler, p.x0)

    def run() -> Any:
        g, x = torch.Generator().manual_seed(SEED_NOISE), p.x0
        for _ in range(w.inner):
            x = sampler.sample(x, 1, generator=g)
        return x

    def check() -> dict:
        g = torch.Generator().manual_seed(SEED_NOISE)
        if w.kind == "langevin_step":
            return {"samples": _np(sampler.sample(p.x0, 1, generator=g)), "acceptance": None}
        res = sampler.sample(p.x0, 1, generator=g, return_diagnostics=True)
        return {"samples": _np(res.samples), "acceptance": float(res.diagnostics.acceptance_rate.mean())}

    return Case(run, check, path=path)


def ebm_nuts(p: Problem) -> Case:
    """W8: ``NUTSSampler(energy, step_size=h, max_tree_depth=10).sample(x0, n_steps, generator=g,
    return_trajectory=True)`` (identity mass, no jitter, no adaptation): with ebm-cuda installed the fused NUTS
    chain (one kernel call per kept draw), else the per-step loop. The correctness run reads every iteration's
    info: the per-step loop's ``NUTSInfo`` through ``callback``, the fused chain's per-call ``FusedInfo`` (one
    iteration per call here) by wrapping the run's chain; neither draws random numbers: same trajectory."""
    import torch
    from ebm_samplers import NUTSSampler

    w, energy = p.w, ebm_energy(p)
    sampler = NUTSSampler(energy, step_size=w.step_size, max_tree_depth=w.max_tree_depth)
    path = ebm_path(sampler, p.x0)

    def run() -> Any:
        return sampler.sample(p.x0, w.n_steps, generator=torch.Generator().manual_seed(SEED_NOISE), return_trajectory=True)

    def sample_fused_recording(seed: int, infos: list) -> Any:
        prepare = sampler.prepare

        def recording(*args: Any, **kwargs: Any) -> Any:
            prepared = prepare(*args, **kwargs)
            chain = prepared.chain

            def chain_recording(state: Any, n: int, key: int, offset: int) -> Any:
                state, info = chain(state, n, key, offset)
                infos.append(info)
                return state, info

            prepared.chain = chain_recording
            return prepared

        sampler.prepare = recording
        try:
            return sampler.sample(p.x0, w.n_steps, generator=torch.Generator().manual_seed(seed), return_trajectory=True)
        finally:
            del sampler.prepare

    def check(seed: int = SEED_NOISE) -> dict:
        infos: list = []
        fused = path.startswith("fused")
        if fused:
            res = sample_fused_recording(seed, infos)
        else:
            res = sampler.sample(
                p.x0,
                w.n_steps,
                generator=torch.Generator().manual_seed(seed),
                return_trajectory=True,
                callback=lambda i, state, info: infos.append(info),
            )

        def stack(name: str) -> np.ndarray:
            return torch.stack([getattr(i, name) for i in infos]).numpy()

        acc = stack("accepted" if fused else "acceptance_prob")
        n_leapfrog = stack("n_leapfrog_steps")
        return {
            "samples": _np(res.samples),
            "acceptance": float(acc.mean()),
            "trajectory": res.trajectory,
            "n_leapfrog": n_leapfrog,
            "acceptance_prob": acc,
            "divergent": stack("divergent"),
            "computed": None if fused else np.array([i.n_leapfrog_computed for i in infos]),
            "lockstep": not fused,
            "tree_depth": stack("tree_depth"),
        }

    return Case(run, check, path=path)


# -- torchebm ----------------------------------------------------------------------------------


def torchebm_model(p: Problem) -> Any:
    import torch
    from torchebm.core import BaseModel, DoubleWellModel, GaussianModel, HarmonicModel

    t = p.w.target
    if t == "gaussian":
        return GaussianModel(torch.zeros(p.w.dim), torch.tensor(p.cov, dtype=torch.float32))
    if t == "standard":
        return HarmonicModel(k=1.0)
    if t == "double_well":
        return DoubleWellModel(barrier_height=1.0, b=1.0)  # torchebm's default barrier_height is 2.0
    if t == "mlp":

        class MLPModel(BaseModel):
            def __init__(self, net: Any) -> None:
                super().__init__()
                self.net = net

            def forward(self, x: Any) -> Any:
                return self.net(x).squeeze(-1)

        return MLPModel(p.net)
    raise ValueError(t)


def torchebm_energy(model: Any) -> Callable[[Any], tuple[np.ndarray, np.ndarray]]:
    """torchebm's own energy and gradient of ``model`` (``model(x)``, ``model.gradient(x)``: what its samplers
    and losses call) at a torch ``x``, for ``energy_check``."""
    import torch

    def energy(x: Any) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            e = model(x)
        return _np(e), _np(model.gradient(x))

    return energy


def torchebm_sampler(p: Problem) -> Any:
    from torchebm.samplers import HamiltonianMonteCarlo, LangevinDynamics

    w, model = p.w, torchebm_model(p)
    if w.kind.startswith("langevin"):
        # torchebm's update: x - h*grad + sqrt(2 * noise_scale^2) * sqrt(h) * xi, so noise_scale=1 is ULA.
        return LangevinDynamics(model, step_size=w.step_size, noise_scale=1.0)
    # mass=None: identity mass; step_size is the leapfrog step, n_leapfrog_steps the trajectory length.
    return HamiltonianMonteCarlo(model, step_size=w.step_size, n_leapfrog_steps=w.n_leapfrog)


def torchebm_sampling(p: Problem) -> Case:
    """W1-W4, S4, S7, S8: ``sampler.sample(x=x0, n_steps=..., generator=g)``."""
    import torch

    w, sampler = p.w, torchebm_sampler(p)

    def run() -> Any:
        return sampler.sample(x=p.x0, n_steps=w.n_steps, generator=torch.Generator().manual_seed(SEED_NOISE))

    def check() -> dict:
        g = torch.Generator().manual_seed(SEED_NOISE)
        if w.kind == "langevin":
            return {"samples": _np(sampler.sample(x=p.x0, n_steps=w.n_steps, generator=g)), "acceptance": None}
        x, diag = sampler.sample(x=p.x0, n_steps=w.n_steps, generator=g, return_diagnostics=True)
        return {"samples": _np(x), "acceptance": float(diag["acceptance_rate"].mean())}

    return Case(run, check, energy=torchebm_energy(sampler.model))


def torchebm_single_step(p: Problem) -> Case:
    """S1, S2: torchebm has no functional single-step sampler API: ``sample(x, n_steps=1)`` ``inner`` times."""
    import torch

    w, sampler = p.w, torchebm_sampler(p)

    def run() -> Any:
        g, x = torch.Generator().manual_seed(SEED_NOISE), p.x0
        for _ in range(w.inner):
            x = sampler.sample(x=x, n_steps=1, generator=g)
        return x

    def check() -> dict:
        g = torch.Generator().manual_seed(SEED_NOISE)
        if w.kind == "langevin_step":
            return {"samples": _np(sampler.sample(x=p.x0, n_steps=1, generator=g)), "acceptance": None}
        x, diag = sampler.sample(x=p.x0, n_steps=1, generator=g, return_diagnostics=True)
        return {"samples": _np(x), "acceptance": float(diag["acceptance_rate"].mean())}

    return Case(run, check, energy=torchebm_energy(sampler.model))


# -- training losses (W5-W7), shared by ebm and torchebm ---------------------------------------


def loss_case(p: Problem, loss_fn: Callable[[Any, Any], tuple[Any, Any]]) -> Case:
    """W5-W7 for one library. ``loss_fn(data, generator) -> (loss, negatives | None)`` is the library's
    call. One timed run = ``inner`` successive steps with one ``torch.Generator(seed 1)``: for W5 each is
    ``loss, backward, Adam step`` (the optimizer is made fresh, and the MLP restored to its initial
    weights, by ``reset``: untimed); for W6/W7 ``loss, backward`` (the weights stay fixed). Gradients are
    set to ``None`` before each backward, as ``zero_grad`` does by default."""
    import torch

    w, net = p.w, p.net
    params = list(net.parameters())
    opt: list[Any] = [None]

    def reset() -> None:
        restore_net(p)
        if w.kind == "cd":
            opt[0] = torch.optim.Adam(params, lr=w.lr)  # fresh state, identical for every library

    def one(g: Any) -> tuple[Any, Any]:
        loss, neg = loss_fn(p.x0, g)
        for q in params:
            q.grad = None
        loss.backward()
        if opt[0] is not None:
            opt[0].step()
        return loss, neg

    def run() -> Any:
        g = torch.Generator().manual_seed(SEED_NOISE)
        for _ in range(w.inner):
            loss, _ = one(g)
        return loss

    def check() -> dict:
        loss, neg = loss_fn(p.x0, torch.Generator().manual_seed(SEED_NOISE))
        for q in params:
            q.grad = None
        loss.backward()
        grads = np.concatenate([_np(q.grad if q.grad is not None else torch.zeros_like(q)).ravel() for q in params])
        out = {"loss": float(loss.detach()), "grads": grads, "negatives": None if neg is None else _np(neg)}
        if opt[0] is not None:
            opt[0].step()
            out["params_after"] = np.concatenate([_np(q).ravel() for q in params])
        return out

    return Case(run, check, reset)


def ebm_loss(p: Problem, autocast: Any = None, fused: bool | None = None) -> Case:
    """W5: ``ebm_losses.ContrastiveDivergence("langevin", n_steps, sampler_options={"step_size": h})``
    (``ebm-step``: with ``"fused": False``, the per-step loop drawing torchebm's noise);
    W6: ``SlicedScoreMatching(n_projections, projection=...)``; W7: ``DenoisingScoreMatching(sigma)``;
    all called as ``loss(energy, data, generator=g)`` on W4's ``EnergyModel`` wrapper of the MLP. With
    ``autocast`` (``ebm-bf16``): the loss under ``torch.autocast("cpu", autocast)`` and CD's sampler with
    ``autocast=autocast``."""
    import contextlib

    import torch

    import ebm_losses

    w, energy = p.w, ebm_energy(p)
    if w.kind == "cd":
        options = (
            {"step_size": w.step_size}
            | ({"autocast": autocast} if autocast is not None else {})
            | ({"fused": fused} if fused is not None else {})
        )
        loss = ebm_losses.ContrastiveDivergence("langevin", w.n_steps, sampler_options=options)
    elif w.kind == "ssm":
        loss = ebm_losses.SlicedScoreMatching(n_projections=w.n_projections, projection=w.projection)
    else:
        loss = ebm_losses.DenoisingScoreMatching(w.sigma)

    def loss_fn(data: Any, g: Any) -> tuple[Any, Any]:
        with torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext():
            value = loss(energy, data, generator=g).float()
        return value, getattr(loss, "last_negatives", None)

    case = loss_case(p, loss_fn)
    if w.kind == "cd":
        case.path = ebm_path(loss.sampler_for(energy), p.x0)
    return case


def torchebm_loss(p: Problem) -> Case:
    """W5: ``torchebm.losses.ContrastiveDivergence(model, LangevinDynamics(model, step_size=h, noise_scale=1),
    k_steps=n_steps, persistent=False, energy_reg_weight=0.0)`` (its default regularisation 0.001 switched
    off, as ours has none); W6: ``SlicedScoreMatching(model, n_projections, projection_type=...)``; W7:
    ``DenoisingScoreMatching(model, noise_scale=sigma)``; all called as ``loss(data, generator=g)``."""
    from torchebm.losses import ContrastiveDivergence, DenoisingScoreMatching, SlicedScoreMatching
    from torchebm.samplers import LangevinDynamics

    w, model = p.w, torchebm_model(p)
    if w.kind == "cd":
        sampler = LangevinDynamics(model, step_size=w.step_size, noise_scale=1.0)
        loss = ContrastiveDivergence(model, sampler, k_steps=w.n_steps, persistent=False, energy_reg_weight=0.0)
    elif w.kind == "ssm":
        loss = SlicedScoreMatching(model, n_projections=w.n_projections, projection_type=w.projection)
    else:
        loss = DenoisingScoreMatching(model, noise_scale=w.sigma)

    def loss_fn(data: Any, g: Any) -> tuple[Any, Any]:
        out = loss(data, generator=g)
        return out if isinstance(out, tuple) else (out, None)  # CD returns (loss, negatives)

    case = loss_case(p, loss_fn)
    case.energy = torchebm_energy(model)
    return case


def reference_loss(p: Problem, stream: bool = False) -> float:
    """The loss written out in plain torch from its definition, with the same random draws in the same
    order (one ``torch.Generator(seed 1)``), on the initial MLP: a third implementation to check both against.
    W5: ULA ``x <- x - h grad E(x) + sqrt(2h) xi`` from the data, ``mean E(data) - mean E(x)``; with ``stream``,
    ``xi`` is the Philox stream a fused chain draws (keyed by one draw from the generator, ``ebm_cuda.reference``); W6:
    ``mean(1/2 (v.grad E)^2 - v.(hess E) v)`` with ``v ~ N(0, I)``; W7:
    ``1/2 mean |grad E(x + sigma eps) - eps/sigma|^2``."""
    import torch

    w, net = p.w, p.net
    restore_net(p)
    g = torch.Generator().manual_seed(SEED_NOISE)
    data = p.x0

    def grad_e(x: Any, create_graph: bool = False) -> Any:
        with torch.enable_grad():
            x = x if x.requires_grad else x.detach().requires_grad_(True)
            return torch.autograd.grad(net(x).sum(), x, create_graph=create_graph)[0]

    if w.kind == "cd":
        x = data.clone()
        if stream:
            from ebm_cuda import reference

            key = int(torch.randint(0, 2**62, (), generator=g))  # what ebmcore.sampler.stream_seed draws
        for t in range(w.n_steps):
            xi = reference.normal(*x.shape, key, t) if stream else torch.randn(x.shape, generator=g, dtype=x.dtype)
            x = x - w.step_size * grad_e(x) + (2 * w.step_size) ** 0.5 * xi
        with torch.no_grad():
            return float(net(data).mean() - net(x).mean())
    if w.kind == "ssm":
        x = data.clone().repeat(w.n_projections, 1).requires_grad_(True)
        ge = grad_e(x, create_graph=True)
        v = torch.randn(x.shape, generator=g, dtype=x.dtype)
        gv = (ge * v).sum(1)
        hv = torch.autograd.grad(gv.sum(), x)[0]
        return float((0.5 * gv.detach() ** 2 - (hv * v).sum(1)).mean())
    eps = torch.randn(data.shape, generator=g, dtype=data.dtype)
    r = grad_e(data + w.sigma * eps) - eps / w.sigma
    return float(0.5 * (r * r).sum(1).mean())


# -- blackjax ----------------------------------------------------------------------------------


def jax_logdensity(p: Problem, float64: bool = False) -> Callable:
    """``log p(x) = -E(x)`` for ONE chain ``x: (d,)`` (vmapped over chains by the runners). ``float64`` (W9's
    ``logistic_float64_check``, under ``jax.enable_x64``): the target's data in float64."""
    import jax
    import jax.numpy as jnp

    t = p.w.target
    if t == "gaussian":
        mean = jnp.asarray(p.mean, dtype=jnp.float32)
        prec = jnp.asarray(np.linalg.inv(p.cov.astype(np.float32).astype(np.float64)), dtype=jnp.float32)
        prec = 0.5 * (prec + prec.T)
        return lambda x: -0.5 * (x - mean) @ (prec @ (x - mean))
    if t == "standard":
        return lambda x: -0.5 * jnp.sum(x * x)
    if t == "double_well":
        return lambda x: -jnp.sum((x * x - 1.0) ** 2)
    if t == "mlp":
        # The same weights as the torch MLP, copied (float32).
        lin = [m for m in p.net if hasattr(m, "weight")]
        params = [(jnp.asarray(m.weight.detach().numpy()), jnp.asarray(m.bias.detach().numpy())) for m in lin]

        def energy(x: Any) -> Any:
            h = x
            for i, (wt, b) in enumerate(params):
                h = wt @ h + b
                if i < len(params) - 1:
                    h = jax.nn.silu(h)
            return h[0]

        return lambda x: -energy(x)
    if t == "logistic":  # the same float32 data; what a BlackJAX user writes for one chain's coefficients
        xs, ys = (jnp.asarray(a, dtype=jnp.float64 if float64 else jnp.float32) for a in p.data)

        def logdensity(beta: Any) -> Any:
            logits = xs @ beta
            return -(0.5 * beta @ beta + jnp.sum(jax.nn.softplus(logits) - ys * logits))

        return logdensity
    raise ValueError(t)


def jax_energy(logdensity: Callable) -> Callable[[Any], tuple[np.ndarray, np.ndarray]]:
    """BlackJAX's energy and gradient: ``-logdensity`` and ``-jax.grad(logdensity)`` (what its kernels evaluate),
    ``jax.vmap``-ed over the rows of a torch ``x`` and jitted, for ``energy_check``; checks that the values are
    float32 (x64 stays off: a float64 peer would be timed on other arithmetic than ebm's)."""
    import jax
    import jax.numpy as jnp

    value_and_grad = jax.jit(jax.vmap(jax.value_and_grad(logdensity)))

    def energy(x: Any) -> tuple[np.ndarray, np.ndarray]:
        logp, grad = value_and_grad(jnp.asarray(x.numpy()))
        if logp.dtype != jnp.float32 or grad.dtype != jnp.float32:
            raise RuntimeError(f"BlackJAX computes in {logp.dtype}, not float32: is jax_enable_x64 on?")
        return -np.asarray(logp, dtype=np.float64), -np.asarray(grad, dtype=np.float64)

    return energy


def blackjax_sampling(p: Problem) -> Case:
    """W1-W4, S4, S7, S8: ``blackjax.sgld`` with the exact gradient (= ULA: its update is
    ``x + h*grad log p + sqrt(2*T*h)*xi``, our convention, no conversion) or ``blackjax.hmc``
    (velocity Verlet, identity inverse mass); ``jax.vmap`` over chains, ``jax.lax.scan`` over steps,
    one ``jax.jit`` for the whole run."""
    import blackjax
    import jax
    import jax.numpy as jnp

    w = p.w
    logdensity = jax_logdensity(p)
    n_chains = w.n_chains
    x0 = jnp.asarray(p.x0.numpy())
    key0 = jax.random.PRNGKey(SEED_NOISE)

    if w.kind == "langevin":
        grad_logp = jax.grad(logdensity)
        sgld = blackjax.sgld(lambda position, minibatch: grad_logp(position))  # exact gradient, no minibatch
        vstep = jax.vmap(lambda key, x: sgld.step(key, x, None, w.step_size))

        @jax.jit
        def sample(key: Any, x: Any) -> Any:
            def body(x: Any, k: Any) -> tuple[Any, None]:
                return vstep(jax.random.split(k, n_chains), x), None

            x, _ = jax.lax.scan(body, x, jax.random.split(key, w.n_steps))
            return x, None

    else:
        hmc = blackjax.hmc(
            logdensity,
            step_size=w.step_size,
            inverse_mass_matrix=jnp.ones(w.dim, jnp.float32),
            num_integration_steps=w.n_leapfrog,
        )
        vstep = jax.vmap(hmc.step)

        @jax.jit
        def sample(key: Any, x: Any) -> Any:
            states = jax.vmap(hmc.init)(x)

            def body(carry: Any, k: Any) -> tuple[Any, None]:
                states, accepted = carry
                states, info = vstep(jax.random.split(k, n_chains), states)
                return (states, accepted + info.is_accepted), None

            (states, accepted), _ = jax.lax.scan(
                body, (states, jnp.zeros(n_chains, jnp.float32)), jax.random.split(key, w.n_steps)
            )
            return states.position, accepted / w.n_steps

    def run() -> Any:
        return jax.block_until_ready(sample(key0, x0))

    def check() -> dict:
        x, acc = jax.block_until_ready(sample(key0, x0))
        if x.dtype != jnp.float32:
            raise RuntimeError(f"BlackJAX's samples are {x.dtype}, not float32: is jax_enable_x64 on?")
        return {"samples": np.asarray(x, dtype=np.float64), "acceptance": None if acc is None else float(jnp.mean(acc))}

    return Case(run, check, energy=jax_energy(logdensity))


def blackjax_nuts(p: Problem) -> Case:
    """W8: ``blackjax.nuts(logdensity, step_size=h, inverse_mass_matrix=ones(d), max_num_doublings=10)``
    (multinomial sampling, iterative U-turn checks, velocity Verlet), ``jax.vmap(nuts.step)`` over chains,
    ``jax.lax.scan`` over iterations stacking the positions (the kept trajectory) and four scalars of
    ``NUTSInfo`` per chain, the whole run one ``jax.jit``; timed after the compile with ``block_until_ready``."""
    import blackjax
    import jax
    import jax.numpy as jnp

    w = p.w
    n_chains = w.n_chains
    logdensity = jax_logdensity(p)
    nuts = blackjax.nuts(
        logdensity,
        step_size=w.step_size,
        inverse_mass_matrix=jnp.ones(w.dim, jnp.float32),
        max_num_doublings=w.max_tree_depth,
    )
    vstep = jax.vmap(nuts.step)
    x0 = jnp.asarray(p.x0.numpy())

    @jax.jit
    def sample(key: Any, x: Any) -> Any:
        states = jax.vmap(nuts.init)(x)

        def body(states: Any, k: Any) -> tuple[Any, Any]:
            states, info = vstep(jax.random.split(k, n_chains), states)
            return states, (
                states.position,
                info.num_integration_steps,
                info.num_trajectory_expansions,
                info.acceptance_rate,
                info.is_divergent,
            )

        _, out = jax.lax.scan(body, states, jax.random.split(key, w.n_steps))
        return out

    def run() -> Any:
        return jax.block_until_ready(sample(jax.random.PRNGKey(SEED_NOISE), x0))

    def check(seed: int = SEED_NOISE) -> dict:
        import torch

        pos, n_leap, expansions, acc, div = (np.asarray(a) for a in jax.block_until_ready(sample(jax.random.PRNGKey(seed), x0)))
        return {
            "samples": np.asarray(pos[-1], dtype=np.float64),
            "acceptance": float(acc.mean()),
            "trajectory": torch.from_numpy(np.array(pos)),
            "n_leapfrog": n_leap,
            "acceptance_prob": acc,
            "divergent": div,
            "computed": None,
            "doublings": expansions,
        }  # doublings attempted, the last one included

    return Case(run, check, energy=jax_energy(logdensity))


# -- ChEES-HMC (W3C, W9; issue 43) -------------------------------------------------------------


@dataclass
class CheesCase:
    """One library's ChEES-HMC for W3C/W9, in two timed calls: ``warmup()`` (adaptation from ``x0``, returns what
    sampling needs: final states and tuned values) and ``sample(warm)`` (``n_steps`` iterations with the tuned values
    frozen, keeping the trajectory; blocks until it exists). ``check()``: the same two calls with the same seed, untimed,
    returning the trajectory ``(n_steps, n_chains, d)`` (torch, float64), the tuned step size and trajectory length,
    per-iteration acceptance probabilities ``(n_steps, n_chains)``, divergences and leapfrog steps ``(n_steps,)``, and the
    warm-up's gradient evaluations per chain. ``energy``: a peer's own energy and gradient, as ``Case.energy``."""

    warmup: Callable[[], Any]
    sample: Callable[[Any], Any]
    check: Callable[[], dict]
    path: str = ""
    energy: Callable[[Any], tuple[np.ndarray, np.ndarray]] | None = None


def ebm_chees(p: Problem) -> CheesCase:
    """W3C, W9: ``ChEESSampler(energy, step_size=h0)``, ``chees_warmup(sampler, x0, n_warmup, generator=g)`` (its
    defaults: target acceptance 0.651 of the harmonic mean, Adam without momentum on ``log T``, learning rate 0.025,
    halton jitter, identity mass, ``T`` starting at the sampler's default ``h0·2⌈√d⌉``), then
    ``sampler.sample(result.x, n_steps, generator=g, return_trajectory=True, **result.tunables)``; one
    ``torch.Generator`` seeded ``SEED_NOISE`` through both."""
    import torch
    from ebm_samplers import ChEESSampler, chees_warmup

    w, energy = p.w, ebm_energy(p)
    sampler = ChEESSampler(energy, step_size=w.step_size)
    path = ebm_path(sampler, p.x0)

    def warmup() -> Any:
        g = torch.Generator().manual_seed(SEED_NOISE)
        return chees_warmup(sampler, p.x0, w.n_warmup, generator=g), g

    def sample(warm: Any, stats: bool = False) -> Any:
        tuned, g = warm
        return sampler.sample(tuned.x, w.n_steps, generator=g, return_trajectory=True, return_stats=stats, **tuned.tunables)

    def check() -> dict:
        tuned, g = warmup()
        res = sample((tuned, g), stats=True)  # the timed path (a callback would force the per-step loop)
        stats = res.stats
        # per draw: the acceptance probability on the per-step loop; on a fused chain (which returns no
        # probabilities) whether the chain accepted, whose mean is the same in expectation
        steps = ebm_chees_leapfrog(sampler, tuned, w.n_steps) if "n_leapfrog_steps" not in stats else None
        return {
            "trajectory": res.trajectory.double(),
            "step_size": tuned.step_size,
            "trajectory_length": tuned.trajectory_length,
            "acceptance_prob": stats["acceptance"].double().numpy(),
            "divergent": stats["divergent"].sum(1).numpy(),
            "n_leapfrog": stats["n_leapfrog_steps"][:, 0].numpy() if steps is None else steps,
            "warmup_gradients": tuned.n_gradient_evaluations,
            "warmup_acceptance": tuned.acceptance,
        }

    return CheesCase(warmup, sample, check, path=path)


def ebm_chees_leapfrog(sampler: Any, tuned: Any, n_steps: int) -> np.ndarray:
    """The leapfrog steps of each of a ChEES run's ``n_steps`` iterations (the jitter is computed on the host; a
    per-step loop's stats do not carry them)."""
    import math

    from ebm_samplers.chees import jitter

    params = tuned.params
    return np.array([max(1, math.ceil(jitter(params, k) * params.max_leapfrog_steps)) for k in range(n_steps)])


def blackjax_chees(p: Problem) -> CheesCase:
    """W3C, W9: ``blackjax.chees_adaptation(logdensity, n_chains)`` (its defaults: target acceptance 0.651 of the
    harmonic mean, halton jitter, decay rate 0.5, identity mass) run with ``optax.adam(0.025, b1=0.0, b2=0.95)`` (the
    paper's optimiser and ebm's) from ``x0`` and the same initial step size ``h0``, its ``run`` inside one ``jax.jit``;
    then ``blackjax.dynamic_hmc(logdensity, **parameters)``, the parameters ``run`` returns (the tuned step size and
    ``T/h``, the identity inverse mass, and its jitter functions, which continue the halton sequence from the warm-up's
    states), ``jax.vmap`` of its step over the chains inside a ``jax.lax.scan`` over iterations stacking the positions,
    one ``jax.jit``. Keys: ``PRNGKey(SEED_NOISE)`` split into a warm-up and a sampling key, as BlackJAX's docs do."""
    import blackjax
    import jax
    import jax.numpy as jnp
    import optax

    w = p.w
    n_chains = w.n_chains
    logdensity = jax_logdensity(p)
    x0 = jnp.asarray(p.x0.numpy())
    key_warmup, key_sample = jax.random.split(jax.random.PRNGKey(SEED_NOISE))
    adaptation = blackjax.chees_adaptation(logdensity, n_chains)
    optim = optax.adam(0.025, b1=0.0, b2=0.95)
    functions: dict[str, Any] = {}  # the parameters that are Python functions (jitter), kept when `adapt` is traced

    @jax.jit
    def adapt(key: Any, x: Any) -> Any:
        (states, parameters), info = adaptation.run(key, x, w.step_size, optim, w.n_warmup)
        functions.update({k: v for k, v in parameters.items() if callable(v)})
        gradients = jnp.sum(info.info.num_integration_steps[:, 0])  # per chain (L per iteration: the gradient is carried)
        return states, {k: v for k, v in parameters.items() if not callable(v)}, gradients

    def kernel(parameters: dict) -> Any:
        return blackjax.dynamic_hmc(logdensity, **parameters, **functions)

    @jax.jit
    def run_sampler(key: Any, states: Any, parameters: dict) -> Any:
        step = jax.vmap(kernel(parameters).step)

        def body(states: Any, k: Any) -> tuple[Any, Any]:
            states, info = step(jax.random.split(k, n_chains), states)
            return states, (states.position, info.acceptance_rate, info.is_divergent, info.num_integration_steps)

        return jax.lax.scan(body, states, jax.random.split(key, w.n_steps))[1]

    def warmup() -> Any:
        return jax.block_until_ready(adapt(key_warmup, x0))

    def sample(warm: Any) -> Any:
        states, parameters, _ = warm
        return jax.block_until_ready(run_sampler(key_sample, states, parameters))

    def check() -> dict:
        import torch

        warm = warmup()
        pos, acc, div, n_leap = (np.asarray(a) for a in sample(warm))
        if pos.dtype != np.float32:
            raise RuntimeError(f"BlackJAX's samples are {pos.dtype}, not float32: is jax_enable_x64 on?")
        _, parameters, gradients = warm
        h = float(parameters["step_size"])
        (n,) = parameters["integration_steps_params"]
        return {
            "trajectory": torch.from_numpy(pos.astype(np.float64)),
            "step_size": h,
            "trajectory_length": h * float(n),
            "acceptance_prob": acc.astype(np.float64),
            "divergent": div.sum(1),
            "n_leapfrog": n_leap[:, 0].astype(np.int64),  # the same for every chain (one halton sequence)
            "warmup_gradients": int(gradients),
            "warmup_acceptance": None,  # chees_adaptation does not report it
        }

    return CheesCase(warmup, sample, check, energy=jax_energy(logdensity))


def chees_moments(traj: Any) -> dict:
    """Per coordinate, from a kept trajectory ``(n_steps, n_chains, d)`` (float64 torch): the mean and variance of all
    draws and their Monte Carlo standard errors, ``sqrt(var / ESS_mean(x))`` and ``sqrt(var((x − m)²) / ESS_mean((x − m)²))``
    (``ebmcore.diagnostics.ess_mean``: the ESS of a mean, which is what these estimate)."""
    from ebmcore.diagnostics import ess_mean

    mean = traj.mean((0, 1))
    sq = (traj - mean).square()
    var = sq.mean((0, 1))
    ess_x, ess_sq = ess_mean(traj), ess_mean(sq)
    se_mean = (var / ess_x).sqrt()
    se_var = (sq.var((0, 1)) / ess_sq).sqrt()
    return {k: v.numpy() for k, v in dict(mean=mean, var=var, se_mean=se_mean, se_var=se_var).items()}


def chees_figures(p: Problem, out: dict) -> dict:
    """W3C, W9, from one library's correctness run (the same draws as its timed runs): bulk ESS (min, median over the
    coordinates) and max split R-hat of the kept trajectory by ``ebmcore.diagnostics`` (as W8), the tuned step size
    and trajectory length, the mean acceptance probability over iterations and chains, divergences, the leapfrog
    steps (= gradient evaluations per chain) of the sampling and of the warm-up, and for W3C the largest ``|z|`` of
    the mean and variance of every coordinate against the target N(0, 1) (``chees_moments``' standard errors)."""
    from ebmcore.diagnostics import ess_bulk, split_rhat

    traj = out["trajectory"]
    ess = ess_bulk(traj)
    n_leap = np.asarray(out["n_leapfrog"], dtype=np.float64)
    fig: dict[str, Any] = {
        "nonfinite_chains": int((~torch_isfinite_chains(traj)).sum()),
        "ess_bulk_min": float(ess.min()),
        "ess_bulk_median": float(ess.median()),
        "rhat_max": float(split_rhat(traj).max()),
        "n_draws": int(traj.shape[0] * traj.shape[1]),
        "step_size": out["step_size"],
        "trajectory_length": out["trajectory_length"],
        "max_leapfrog_steps": out["trajectory_length"] / out["step_size"],
        "acceptance": float(np.mean(out["acceptance_prob"])),
        "divergences": int(np.sum(out["divergent"])),
        "leapfrog_mean": float(n_leap.mean()),
        "gradients_per_chain": float(n_leap.sum()),
        "warmup_gradients_per_chain": out["warmup_gradients"],
        "warmup_acceptance": out["warmup_acceptance"],
    }
    fig["ess_per_gradient"] = fig["ess_bulk_min"] / (p.w.n_chains * fig["gradients_per_chain"])
    if p.w.target == "standard":  # against the truth: mean 0, variance 1
        m = chees_moments(traj)
        fig["mean_z_max"] = float(np.abs(m["mean"] / m["se_mean"]).max())
        fig["var_z_max"] = float(np.abs((m["var"] - 1.0) / m["se_var"]).max())
        fig["moments_z_max"] = max(fig["mean_z_max"], fig["var_z_max"])
        fig["moments_ok"] = bool(fig["moments_z_max"] <= Z_TOL)
        fig["law"] = "target N(0, I) (standard errors from ess_mean)"
    return fig


def logistic_float64_check(p: Problem) -> dict:
    """W9's energy check. In float32 the two libraries' gradients differ by about 2.6e-6 (scaled as in
    ``energy_check``), more than ``ENERGY_TOL``: each is that far from the exact value (a sum over 1,000 rows of
    float32 sigmoids times features), whichever library computes it. So the same code of each library is evaluated in
    float64 too (ebm's ``LogisticRegressionEnergy`` on float64 data and ``x0``; BlackJAX's log density on float64 data
    under ``jax.enable_x64``) and held to ``ENERGY_TOL`` there: the same function. Also reported: each library's
    float32 error against the float64 formula written out in numpy (``float32_err_*``), the size of float32 rounding."""
    import jax
    import jax.numpy as jnp

    def scaled(a: np.ndarray, ref: np.ndarray) -> float:
        return float((np.abs(np.asarray(a, dtype=np.float64).reshape(ref.shape) - ref) / np.maximum(1.0, np.abs(ref))).max())

    x, y = (a.astype(np.float64) for a in p.data)
    b = p.x0.double().numpy()
    logits = b @ x.T
    e_ref = 0.5 * (b * b).sum(1) + (np.logaddexp(logits, 0.0) - y * logits).sum(1)
    g_ref = b + (1.0 / (1.0 + np.exp(-logits)) - y) @ x
    e64, g64 = (_np(t) for t in logistic_energy(x, y).energy_and_gradient(p.x0.double()))
    with jax.enable_x64(True):
        value_and_grad = jax.jit(jax.vmap(jax.value_and_grad(jax_logdensity(p, float64=True))))
        lp, gl = value_and_grad(jnp.asarray(b, dtype=jnp.float64))
        if lp.dtype != jnp.float64:
            raise RuntimeError(f"BlackJAX's float64 check computed in {lp.dtype}")
        je64, jg64 = -np.asarray(lp), -np.asarray(gl)
    e32, g32 = (_np(t) for t in ebm_energy(p).energy_and_gradient(p.x0))
    je32, jg32 = jax_energy(jax_logdensity(p))(p.x0)
    out = {
        "energy_diff_vs_ebm_float64": scaled(je64, e64),
        "grad_diff_vs_ebm_float64": scaled(jg64, g64),
        "float32_err_ebm": [scaled(e32, e_ref), scaled(g32, g_ref)],
        "float32_err_blackjax": [scaled(je32, e_ref), scaled(jg32, g_ref)],
    }
    out["energy_ok"] = bool(max(out["energy_diff_vs_ebm_float64"], out["grad_diff_vs_ebm_float64"]) <= ENERGY_TOL)
    return out


def torch_isfinite_chains(traj: Any) -> Any:
    """Per chain, whether every kept draw of ``traj: (n_steps, n_chains, d)`` is finite."""
    import torch

    return torch.isfinite(traj).all(2).all(0)


def chees_agreement(a: dict, b: dict) -> dict:
    """W9: two libraries' posterior means and variances against each other, per coordinate, as the largest ``|z|``
    with both Monte Carlo errors (``chees_moments``): independent runs of a correct sampler agree to ``|z| ≤ Z_TOL``."""
    ma, mb = chees_moments(a["trajectory"]), chees_moments(b["trajectory"])
    z_mean = np.abs(ma["mean"] - mb["mean"]) / np.sqrt(ma["se_mean"] ** 2 + mb["se_mean"] ** 2)
    z_var = np.abs(ma["var"] - mb["var"]) / np.sqrt(ma["se_var"] ** 2 + mb["se_var"] ** 2)
    fig = {"mean_z_max": float(z_mean.max()), "var_z_max": float(z_var.max())}
    fig["moments_z_max"] = max(fig.values())
    fig["moments_ok"] = bool(fig["moments_z_max"] <= Z_TOL)
    fig["law"] = "other library's posterior (both MC errors)"
    fig["posterior_sd_range"] = [float(np.sqrt(ma["var"]).min()), float(np.sqrt(ma["var"]).max())]
    return fig


def run_chees_workload(w: Workload, libs: list[str], repeats: int) -> dict:
    """W3C, W9: per library one untimed warm-up of both calls (JAX compiles),
    the correctness run, then ``repeats`` interleaved timed runs, each timing the warm-up and then the sampling from
    its result. Medians of each; ESS/s = min bulk ESS / median sampling time (and / median warm-up + sampling)."""
    import torch

    p = make_problem(w)
    x0_copy = p.x0.clone()
    builders = {"ebm": ebm_chees, "blackjax": blackjax_chees}
    cases = {lib: builders[lib](p) for lib in libs if lib in builders}
    results: dict[str, dict] = {}
    outs: dict[str, dict] = {}
    for lib, case in cases.items():
        t0 = time.perf_counter()
        case.sample(case.warmup())  # JAX: both compiles
        first = time.perf_counter() - t0
        out = outs[lib] = case.check()
        fig = chees_figures(p, out)
        if case.energy is not None:
            fig.update(energy_check(p, case.energy))
            if w.target == "logistic":  # float32 rounding exceeds ENERGY_TOL here: the same code in float64
                fig.update(logistic_float64_check(p))
        results[lib] = {"warmup_s": first, "times_s": [], "warmup_times_s": [], "sample_times_s": [], "figures": fig}
        if case.path:
            results[lib]["path"] = case.path
    if w.target != "standard" and len(outs) == 2:  # no closed form: the libraries against each other
        agree = chees_agreement(outs["ebm"], outs["blackjax"])
        for r in results.values():
            r["figures"].update(agree)
    for _ in range(repeats):  # interleaved
        for lib, case in cases.items():
            gc.collect()
            t0 = time.perf_counter()
            warm = case.warmup()
            t1 = time.perf_counter()
            case.sample(warm)
            t2 = time.perf_counter()
            r = results[lib]
            r["warmup_times_s"].append(t1 - t0)
            r["sample_times_s"].append(t2 - t1)
            r["times_s"].append(t2 - t0)
            del warm
    for r in results.values():
        f = r["figures"]
        r["median_s"] = statistics.median(r["times_s"])  # warm-up + sampling
        r["min_s"], r["max_s"] = min(r["times_s"]), max(r["times_s"])
        r["warmup_median_s"] = statistics.median(r["warmup_times_s"])
        r["sample_median_s"] = statistics.median(r["sample_times_s"])
        r["samples_per_s"] = w.n_chains * w.n_steps / r["sample_median_s"]
        r["ess_per_s"] = f["ess_bulk_min"] / r["sample_median_s"]
        r["ess_per_s_with_warmup"] = f["ess_bulk_min"] / (r["warmup_median_s"] + r["sample_median_s"])
    if not torch.equal(p.x0, x0_copy):
        print(f"WARNING {w.id}: a sampler modified x0 in place", file=sys.stderr)
    ebm = results.get("ebm")
    for r in results.values():
        r["ratio_vs_ebm"] = r["median_s"] / ebm["median_s"] if ebm else None
        r["ratio_vs_ebm_step"] = None
        r["ebm_ess_per_s_over_this"] = ebm["ess_per_s"] / r["ess_per_s"] if ebm else None
        r["ebm_ess_per_s_with_warmup_over_this"] = ebm["ess_per_s_with_warmup"] / r["ess_per_s_with_warmup"] if ebm else None
        r["ebm_ess_per_gradient_over_this"] = (
            ebm["figures"]["ess_per_gradient"] / r["figures"]["ess_per_gradient"] if ebm else None
        )
    return {"workload": w.__dict__, "results": results}


def chees_table(w: Workload, res: dict) -> str:
    head = (
        "| library | warm-up (ms) | sampling (ms) | min–max of warm-up + sampling (ms) | first call (ms) | step size h "
        "| trajectory length T (T/h) | leapfrog / iteration (warm-up gradients / chain) | acceptance | divergences "
        "| min bulk ESS (median) | ESS/s | ebm ESS/s ÷ this | ESS/s with warm-up | ebm ÷ this | ESS per gradient "
        "| ebm ÷ this | correctness |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]

    def ref(lib: str, x: float | None) -> str:
        return "—" if x is None else "1 (ref)" if lib == "ebm" else f"{x:.2f}"

    for lib, r in res["results"].items():
        f = r["figures"]
        corr = f"R-hat max {f['rhat_max']:.4f}, {f['n_draws']:,} kept draws"
        if "moments_z_max" in f:
            corr += (
                f", max |z| of the means {f['mean_z_max']:.1f} and variances {f['var_z_max']:.1f} vs the {f['law']} "
                f"({'ok' if f['moments_ok'] else '**FAIL**'}: ≤ {Z_TOL:g})"
            )
        if f.get("nonfinite_chains"):
            corr += f", **{f['nonfinite_chains']} non-finite chains**"
        if "energy_diff_vs_ebm" in f:
            corr += ", " + format_energy(f)
        warm_grads = "?" if f["warmup_gradients_per_chain"] is None else f"{f['warmup_gradients_per_chain']:,}"
        lines.append(
            f"| {lib} | {1e3 * r['warmup_median_s']:.0f} | {1e3 * r['sample_median_s']:.0f} | "
            f"{1e3 * r['min_s']:.0f}–{1e3 * r['max_s']:.0f} | {1e3 * r['warmup_s']:.0f} | {f['step_size']:.4f} | "
            f"{f['trajectory_length']:.3f} ({f['max_leapfrog_steps']:.2f}) | {f['leapfrog_mean']:.2f} ({warm_grads}) | "
            f"{f['acceptance']:.3f} | {f['divergences']} | {f['ess_bulk_min']:,.0f} ({f['ess_bulk_median']:,.0f}) | "
            f"{r['ess_per_s']:,.0f} | {ref(lib, r['ebm_ess_per_s_over_this'])} | {r['ess_per_s_with_warmup']:,.0f} | "
            f"{ref(lib, r['ebm_ess_per_s_with_warmup_over_this'])} | {f['ess_per_gradient']:.4f} | "
            f"{ref(lib, r['ebm_ess_per_gradient_over_this'])} | {corr} |"
        )
    paths = [f"{lib}: {r['path']}" for lib, r in res["results"].items() if r.get("path")]
    if paths:
        lines.append("\nebm's code path — " + "; ".join(paths) + ".")
    return "\n".join(lines)


def build_case(lib: str, p: Problem) -> Case | None:
    step = p.w.kind.endswith("_step")
    if lib == "ebm-bf16":  # W4-W7 only, a separate row (never instead of float32): W4 the fused chain with bfloat16
        import torch  # products (precision="bf16"), W5-W7 the MLP energy under autocast

        if p.w.target != "mlp" or p.w.kind not in BF16_KINDS:
            return None
        return ebm_loss(p, torch.bfloat16) if p.w.kind in LOSS_KINDS else ebm_sampling(p, precision="bf16")
    if p.w.kind in LOSS_KINDS:  # no BlackJAX losses; ebm-step: W5's negatives by the per-step loop
        if lib == "ebm-step":
            return ebm_loss(p, fused=False) if p.w.kind == "cd" else None
        return {"ebm": ebm_loss, "torchebm": torchebm_loss}.get(lib, lambda _: None)(p)
    if p.w.kind == "nuts":  # ebm: the fused chain where ebm-cuda provides one (no ebm-step variant)
        return {"ebm": ebm_nuts, "blackjax": blackjax_nuts}.get(lib, lambda _: None)(p)  # torchebm has no NUTS
    if lib == "ebm":
        return ebm_single_step(p) if step else ebm_sampling(p)
    if lib == "ebm-step":  # S1/S2: the functional step is the per-step path already ("ebm"); see ebm-step:sample1
        return None if step else ebm_sampling(p, fused=False)
    if lib == "ebm:sample1":
        return ebm_single_step_object(p)
    if lib == "ebm-step:sample1":
        return ebm_single_step_object(p, fused=False)
    if lib == "torchebm":
        return torchebm_single_step(p) if step else torchebm_sampling(p)
    if lib == "blackjax":
        return blackjax_sampling(p) if p.w.kind in BLACKJAX_KINDS else None
    raise ValueError(lib)


# ----------------------------------------------------------------------------------------------
# Correctness figures
# ----------------------------------------------------------------------------------------------


def ula_gaussian_law(cov: np.ndarray, h: float, n_steps: int) -> np.ndarray:
    """Exact covariance of ULA on ``N(0, cov)`` after ``n_steps`` from ``N(0, I)`` (the mean stays 0):
    ``C_{k+1} = A C_k A^T + 2h I`` with ``A = I - h P``."""
    d = cov.shape[0]
    a = np.eye(d) - h * np.linalg.inv(cov)
    c = np.eye(d)
    for _ in range(n_steps):
        c = a @ c @ a.T + 2.0 * h * np.eye(d)
    return c


def double_well_x2() -> float:
    """``E[x_i^2]`` under ``exp(-(x^2 - 1)^2)`` by quadrature (0.8327)."""
    x = np.linspace(-5.0, 5.0, 400_001)
    wgt = np.exp(-((x * x - 1.0) ** 2))
    return float((x * x * wgt).sum() / wgt.sum())


_DW_LAW: dict[tuple[float, int], tuple[float, float]] = {}


def ula_double_well_law(h: float, n_steps: int, barrier: float = 1.0) -> tuple[float, float]:
    """``E[x^2]`` and ``Var[x^2]`` of one coordinate after ``n_steps`` ULA steps of size ``h`` on
    ``barrier (x^2 - 1)^2`` from ``x ~ N(0, 1)`` (the coordinates are independent: the energy is a sum).
    The law is propagated on a grid over [-5, 5] (spacing at most ``sqrt(2h)/8``, the noise's standard
    deviation over 8: at ``h = 0.01`` the result agrees with a 4x finer grid to 1e-13):
    ``p_{k+1}(y) = sum_x p_k(x) N(y; x - h E'(x), 2h)``, each row of the kernel normalised on the grid.
    This is the exact distribution of the samples (up to the grid), i.e. what ULA should produce,
    bias and incomplete mixing included; the quadrature value is the target's."""
    key = (h, n_steps)
    if key not in _DW_LAW:
        x = np.linspace(-5.0, 5.0, int(np.ceil(10.0 / (np.sqrt(2.0 * h) / 8.0))) + 1)
        mu = x - h * 4.0 * barrier * x * (x * x - 1.0)
        kern = np.exp(-((x[None, :] - mu[:, None]) ** 2) / (4.0 * h))
        kern /= kern.sum(1, keepdims=True)
        dens = np.exp(-0.5 * x * x)
        dens /= dens.sum()
        for _ in range(n_steps):
            dens = dens @ kern
        m2 = float((dens * x**2).sum())
        _DW_LAW[key] = (m2, float((dens * x**4).sum()) - m2 * m2)
    return _DW_LAW[key]


def moment_z_scores(x: np.ndarray, mean: np.ndarray, cov: np.ndarray) -> tuple[float, float]:
    """Largest ``|z|`` of the sample mean and of the sample covariance entries of ``x: (n, d)`` (i.i.d. draws)
    against a Gaussian law ``N(mean, cov)``: ``se(mean_i) = sqrt(C_ii / n)``,
    ``se(S_ij) = sqrt((C_ij^2 + C_ii C_jj) / n)``."""
    n = x.shape[0]
    diag = np.diag(cov)
    z_mean = np.abs(x.mean(0) - mean) / np.sqrt(diag / n)
    z_cov = np.abs(np.cov(x, rowvar=False) - cov) / np.sqrt((cov * cov + np.outer(diag, diag)) / n)
    return float(z_mean.max()), float(z_cov.max())


def figures(p: Problem, out: dict, ref: np.ndarray | None) -> dict:
    """Correctness numbers from one library's samples (same computation for every library).

    Besides the errors against the target, each sampler is held to the exact law of its samples where it
    is known, which needs no shared noise (the fused chain's Philox stream differs from the
    ``torch.Generator``'s): the chains are independent and start from i.i.d. ``N(0, I)``, so the final
    states are i.i.d. draws from (Gaussians, Langevin) the ULA law after ``n_steps``
    (``ula_gaussian_law``), (Gaussians, HMC) the target itself (``x0`` is already distributed as the
    standard Gaussian and HMC leaves it invariant), (double well) the ULA law on a grid
    (``ula_double_well_law``). ``moments_z_max`` is the largest ``|z|`` over the mean and covariance
    entries (Gaussians) or of ``E[x^2]`` (double well), with standard errors from that law;
    ``moments_ok``: ``moments_z_max <= Z_TOL``. ``ref``: the samples of the same-noise reference (ebm-step,
    or ebm's own per-step path) for the max abs difference."""
    import torch

    w, x = p.w, out["samples"]
    fig: dict[str, Any] = {}
    fig["nonfinite_chains"] = int((~np.isfinite(x).all(1)).sum())
    if out.get("acceptance") is not None:
        fig["acceptance"] = out["acceptance"]
    if w.target in ("gaussian", "standard"):
        fig["mean_err"] = float(np.abs(x.mean(0) - p.mean).max())
        fig["cov_err"] = float(np.abs(np.cov(x, rowvar=False) - p.cov).max())
        if w.kind.startswith("langevin"):
            law = ula_gaussian_law(p.cov, w.step_size, w.n_steps)
            fig["cov_err_vs_ula_law"] = float(np.abs(np.cov(x, rowvar=False) - law).max())
            fig["law"] = f"ULA law after {w.n_steps} step{'s' if w.n_steps > 1 else ''}"
        elif w.target == "standard":  # HMC from x0 ~ N(0, I), the target: stationary from the start
            law = p.cov
            fig["law"] = "target (x0 is drawn from it)"
        else:
            law = None
        if law is not None and np.isfinite(x).all():
            z_mean, z_cov = moment_z_scores(x, np.zeros(w.dim), law)
            fig["mean_z_max"], fig["cov_z_max"] = z_mean, z_cov
            fig["moments_z_max"] = max(z_mean, z_cov)
    elif w.target == "double_well":
        fig["mean_x2"] = float((x * x).mean())
        fig["mean_x2_quadrature"] = double_well_x2()
        if w.kind.startswith("langevin") and np.isfinite(x).all():
            m2, v2 = ula_double_well_law(w.step_size, w.n_steps)
            fig["mean_x2_ula_law"] = m2
            fig["law"] = f"ULA law after {w.n_steps} steps"
            fig["mean_x2_se"] = float(np.sqrt(v2 / x.size))
            fig["moments_z_max"] = abs(fig["mean_x2"] - m2) / fig["mean_x2_se"]
    elif w.target == "mlp":
        with torch.no_grad():
            fig["mean_energy"] = float(p.net(torch.tensor(x, dtype=torch.float32)).mean())
    if "moments_z_max" in fig:
        fig["moments_ok"] = bool(fig["moments_z_max"] <= Z_TOL)
    if ref is not None:
        fig["max_abs_diff_vs_ebm_samples"] = float(np.abs(x - ref).max())
    return fig


def nuts_figures(p: Problem, out: dict) -> dict:
    """W8, from one library's correctness run (the same draws as its timed runs), all with ebmcore's diagnostics:
    bulk ESS (min and median over the 20 coordinates) and rank-normalised split R-hat (max) of the kept
    trajectory ``(n_steps, n_chains, d)``; the errors of the mean and covariance of all ``n_steps x n_chains``
    kept draws against the identity target; per (iteration, chain) trajectory lengths in leapfrog steps
    (mean, max); the lockstep cost per iteration: none for ebm's fused chain (each chain its own trajectories),
    for ebm's per-step loop the measured ``n_leapfrog_computed`` (the steps the whole batch paid for), for BlackJAX the bound ``2^(max over chains of doublings) - 1`` (a vmapped
    ``while_loop`` also runs every lane until the last one stops; not measured); the mean acceptance
    statistic and the number of divergent transitions."""
    from ebmcore.diagnostics import ess_bulk, split_rhat

    traj = out["trajectory"]
    ess, rhat = ess_bulk(traj), split_rhat(traj)
    draws = traj.reshape(-1, traj.shape[-1]).double().numpy()
    n_leap = np.asarray(out["n_leapfrog"], dtype=np.float64)
    fig: dict[str, Any] = {
        "nonfinite_chains": int((~np.isfinite(out["samples"]).all(1)).sum()),
        "ess_bulk_min": float(ess.min()),
        "ess_bulk_median": float(ess.median()),
        "rhat_max": float(rhat.max()),
        "n_draws": int(draws.shape[0]),
        "mean_err": float(np.abs(draws.mean(0) - p.mean).max()),
        "cov_err": float(np.abs(np.cov(draws, rowvar=False) - p.cov).max()),
        "acceptance": out["acceptance"],
        "divergences": int(np.asarray(out["divergent"]).sum()),
        "leapfrog_mean": float(n_leap.mean()),
        "leapfrog_max": int(n_leap.max()),
        "total_leapfrog_per_chain": float(n_leap.sum(0).mean()),
    }
    if not out.get("lockstep", True):  # each chain runs its own trajectories (ebm's fused chain): no lockstep
        fig["lockstep_per_iter"] = fig["leapfrog_mean"]
        fig["lockstep_measured"] = None
        fig["lockstep_waste"] = 0.0
    elif out["computed"] is not None:
        computed = np.asarray(out["computed"], dtype=np.float64)
        fig["lockstep_per_iter"] = float(computed.mean())
        fig["lockstep_measured"] = True
        fig["lockstep_waste"] = float(1.0 - n_leap.mean(1).sum() / computed.sum())  # share of batch steps no chain needed
    else:
        bound = 2.0 ** np.asarray(out["doublings"]).max(1) - 1.0
        fig["lockstep_per_iter"] = float(bound.mean())
        fig["lockstep_measured"] = False
        fig["lockstep_waste"] = float(1.0 - n_leap.mean(1).sum() / bound.sum())
    return fig


def loss_figures(p: Problem, out: dict, ref: dict | None, reference: float) -> dict:
    """W5-W7: the loss and the norm of its parameter gradient on the initial weights (first call of a run);
    against ebm's (same draws): relative differences of the loss and of the gradient, and for W5 the largest
    differences of the negatives and of the weights after the Adam step."""
    fig: dict[str, float] = {"loss": out["loss"], "grad_norm": float(np.linalg.norm(out["grads"])), "loss_formula": reference}
    fig["nonfinite"] = int(not (np.isfinite(out["loss"]) and np.isfinite(out["grads"]).all()))
    if ref is not None:
        fig["loss_rel_diff_vs_ebm"] = abs(out["loss"] - ref["loss"]) / max(abs(ref["loss"]), 1e-30)
        fig["grad_rel_diff_vs_ebm"] = float(
            np.linalg.norm(out["grads"] - ref["grads"]) / max(np.linalg.norm(ref["grads"]), 1e-30)
        )
        if out.get("negatives") is not None and ref.get("negatives") is not None:
            fig["negatives_max_abs_diff_vs_ebm"] = float(np.abs(out["negatives"] - ref["negatives"]).max())
        if "params_after" in out and "params_after" in ref:
            fig["params_after_max_abs_diff_vs_ebm"] = float(np.abs(out["params_after"] - ref["params_after"]).max())
    return fig


def format_energy(fig: dict) -> str:
    """``energy_check``'s figures as a results row gives them ('' for ebm's own rows)."""
    if "energy_diff_vs_ebm" not in fig:
        return ""
    if "energy_diff_vs_ebm_float64" in fig:  # W9: see logistic_float64_check
        e, b = fig["float32_err_ebm"], fig["float32_err_blackjax"]
        return (
            f"E and ∇E vs ebm's, both in float64: {fig['energy_diff_vs_ebm_float64']:.1e}, "
            f"{fig['grad_diff_vs_ebm_float64']:.1e} ({'ok' if fig['energy_ok'] else '**FAIL**'}: ≤ {ENERGY_TOL:g}); "
            f"in float32: {fig['energy_diff_vs_ebm']:.1e}, {fig['grad_diff_vs_ebm']:.1e}, float32 rounding "
            f"(each vs the float64 formula): ebm {e[0]:.1e}, {e[1]:.1e}, BlackJAX {b[0]:.1e}, {b[1]:.1e}"
        )
    return (
        f"E and ∇E vs ebm's: {fig['energy_diff_vs_ebm']:.1e}, {fig['grad_diff_vs_ebm']:.1e} "
        f"({'ok' if fig['energy_ok'] else '**FAIL**'}: ≤ {ENERGY_TOL:g})"
    )


def format_figures(w: Workload, fig: dict) -> str:
    parts = []
    if "loss" in fig:
        noise = f" with the {fig['formula_noise']}" if "formula_noise" in fig else ""
        parts.append(f"loss {fig['loss']:.6g} (formula{noise} {fig['loss_formula']:.6g}), grad norm {fig['grad_norm']:.5g}")
        if fig.get("nonfinite"):
            parts.append("**non-finite**")
        if "loss_rel_diff_vs_ebm" in fig:
            parts.append(f"rel diff vs ebm: loss {fig['loss_rel_diff_vs_ebm']:.1e}, gradient {fig['grad_rel_diff_vs_ebm']:.1e}")
        if "negatives_max_abs_diff_vs_ebm" in fig:
            parts.append(
                f"max abs diff vs ebm: negatives {fig['negatives_max_abs_diff_vs_ebm']:.1e}, "
                f"weights after the Adam step {fig['params_after_max_abs_diff_vs_ebm']:.1e}"
            )
        if "energy_diff_vs_ebm" in fig:
            parts.append(format_energy(fig))
        return ", ".join(parts)
    if "acceptance" in fig:
        parts.append(f"acc {fig['acceptance']:.3f}")
    if "mean_err" in fig:
        parts.append(f"mean err {fig['mean_err']:.3f}")
        parts.append(f"cov err {fig['cov_err']:.3f}")
    if "cov_err_vs_ula_law" in fig:
        parts.append(
            f"cov err vs exact ULA law after {w.n_steps} step{'s' if w.n_steps > 1 else ''} {fig['cov_err_vs_ula_law']:.3f}"
        )
    if "mean_z_max" in fig:
        parts.append(
            f"max z vs {fig['law']}: mean {fig['mean_z_max']:.1f}, cov {fig['cov_z_max']:.1f} "
            f"({'ok' if fig['moments_ok'] else '**FAIL**'}: ≤ {Z_TOL:g})"
        )
    if "mean_x2" in fig:
        if "mean_x2_ula_law" in fig:
            z = (fig["mean_x2"] - fig["mean_x2_ula_law"]) / fig["mean_x2_se"]
            parts.append(
                f"E[x²] {fig['mean_x2']:.4f} (exact ULA law {fig['mean_x2_ula_law']:.4f} ± {fig['mean_x2_se']:.4f}, "
                f"z {z:+.1f}, {'ok' if fig['moments_ok'] else '**FAIL**'}: ≤ {Z_TOL:g}; "
                f"quadrature {fig['mean_x2_quadrature']:.4f})"
            )
        else:
            parts.append(f"E[x²] {fig['mean_x2']:.4f} (quadrature {fig['mean_x2_quadrature']:.4f})")
    if "mean_energy" in fig:
        parts.append(f"mean E {fig['mean_energy']:.4f}")
    if fig.get("nonfinite_chains"):
        parts.append(f"**{fig['nonfinite_chains']} non-finite chains**")
    if "max_abs_diff_vs_ebm_samples" in fig:
        parts.append(
            f"max abs diff vs {fig.get('same_noise_ref', 'ebm')}'s samples "  # no '|': Markdown
            f"{fig['max_abs_diff_vs_ebm_samples']:.1e}"
        )
    if "energy_diff_vs_ebm" in fig:
        parts.append(format_energy(fig))
    return ", ".join(parts)


# ----------------------------------------------------------------------------------------------
# Timing and reporting
# ----------------------------------------------------------------------------------------------


def time_once(fn: Callable[[], Any]) -> float:
    """Seconds for one call of ``fn`` (which blocks until its result exists); garbage collected first."""
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_workload(w: Workload, libs: list[str], repeats: int) -> dict:
    import torch

    if w.kind == "chees":  # two timed calls per run (warm-up, sampling): its own loop
        return run_chees_workload(w, libs, repeats)

    p = make_problem(w)
    x0_copy = p.x0.clone()
    reference = reference_loss(p) if w.kind in LOSS_KINDS else None
    names = list(libs)
    if w.kind.endswith("_step") and "ebm" in names:
        names.insert(names.index("ebm") + 1, "ebm:sample1")
    if w.kind.endswith("_step") and "ebm-step" in names:  # the functional step ("ebm") is per-step already
        names[names.index("ebm-step")] = "ebm-step:sample1"
    cases: dict[str, Case] = {}
    for lib in names:
        case = build_case(lib, p)
        if case is not None:
            cases[lib] = case
    results: dict[str, dict] = {}
    ref, ref_name = None, None  # the output of the ebm case that draws torchebm's noise (torch.Generator, per step)
    ebm_samples = None  # ebm's own samples (a fused chain's: the Philox draws the bf16 chain shares)
    for lib, case in cases.items():  # warm-up (JAX: compile), then the untimed correctness run
        case.reset()
        warm = time_once(case.run)  # the whole first run (S1, S2, W5-W7: all `inner` calls of it)
        case.reset()
        out = case.check()
        compare = lib in ("torchebm", "ebm-bf16") and ref is not None  # same torch.Generator stream as ebm-step
        same, same_name = ref, ref_name
        if lib == "ebm-bf16" and case.path.startswith("fused") and ebm_samples is not None:  # ebm's Philox draws
            compare, same, same_name = True, ebm_samples, "ebm"
        if w.kind in LOSS_KINDS:
            fused_cd = w.kind == "cd" and case.path.startswith("fused")  # its noise: the Philox stream
            fig = loss_figures(p, out, same if compare else None, reference_loss(p, stream=True) if fused_cd else reference)
            if fused_cd:
                fig["formula_noise"] = "Philox stream"
        elif w.kind == "nuts":
            fig = nuts_figures(p, out)
            seeds = NUTS_ESS_SEEDS[:2] if w.n_steps < 50 else NUTS_ESS_SEEDS  # --quick: keep it short
            fig["ess_bulk_min_by_seed"] = {
                s: (fig["ess_bulk_min"] if s == SEED_NOISE else float(nuts_figures(p, case.check(s))["ess_bulk_min"]))
                for s in seeds
            }
        else:
            fig = figures(p, out, same if compare else None)
        if compare:
            fig["same_noise_ref"] = same_name
        if case.energy is not None:  # a peer: the energy it is timed on is ebm's (energy_check)
            fig.update(energy_check(p, case.energy))
        results[lib] = {"warmup_s": warm, "times_s": [], "figures": fig}
        if case.path:
            results[lib]["path"] = case.path
        if lib == "ebm-step" or (lib == "ebm" and not case.path.startswith("fused")):
            ref, ref_name = (out if w.kind in LOSS_KINDS else out["samples"]), lib
        if lib == "ebm" and w.kind not in LOSS_KINDS and "samples" in out:
            ebm_samples = out["samples"]
    for _ in range(repeats):  # interleaved
        for lib, case in cases.items():
            case.reset()  # untimed: W5 restores the initial weights and makes a fresh optimizer
            results[lib]["times_s"].append(time_once(case.run))
    per = per_call(w)
    for r in results.values():
        r["median_s"] = statistics.median(r["times_s"]) / per
        r["min_s"] = min(r["times_s"]) / per
        r["max_s"] = max(r["times_s"]) / per
        r["samples_per_s"] = w.n_chains * w.n_steps / r["median_s"] if per == 1 else w.n_chains / r["median_s"]
    if not torch.equal(p.x0, x0_copy):
        print(f"WARNING {w.id}: a sampler or loss modified x0 (the data batch) in place", file=sys.stderr)
    base = results.get("ebm", {}).get("median_s")
    base_step = results.get("ebm-step", {}).get("median_s")
    for r in results.values():
        r["ratio_vs_ebm"] = (r["median_s"] / base) if base else None
        r["ratio_vs_ebm_step"] = (r["median_s"] / base_step) if base_step else None
    if w.kind == "nuts":  # ESS per second of the timed runs' median; ebm's over the peer's (> 1: ebm better)
        for r in results.values():
            r["ess_per_s"] = r["figures"]["ess_bulk_min"] / r["median_s"]
            by_seed = list(r["figures"]["ess_bulk_min_by_seed"].values())
            r["ess_per_s_median_over_seeds"] = statistics.median(by_seed) / r["median_s"]
        ebm_rate = results.get("ebm", {}).get("ess_per_s")
        for r in results.values():
            r["ebm_ess_per_s_over_this"] = (ebm_rate / r["ess_per_s"]) if ebm_rate else None
    return {"workload": w.__dict__, "results": results}


def nuts_table(w: Workload, res: dict) -> str:
    head = (
        "| library | median (ms) | min–max (ms) | first call (ms) | time peer / ebm | min ESS (bulk) | ESS/s "
        "| ebm ESS/s ÷ this | leapfrog / iteration: mean, max | lockstep leapfrog / iteration (waste) | correctness |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for lib, r in res["results"].items():
        f = r["figures"]
        ratio = "—" if r["ratio_vs_ebm"] is None else ("1 (ref)" if lib == "ebm" else f"{r['ratio_vs_ebm']:.2f}")
        ess_ratio = (
            "—" if r["ebm_ess_per_s_over_this"] is None else "1 (ref)" if lib == "ebm" else f"{r['ebm_ess_per_s_over_this']:.2f}"
        )
        lock = f"{f['lockstep_per_iter']:.2f} ({100 * f['lockstep_waste']:.1f} %)"
        if f["lockstep_measured"] is None:
            lock = "none (each chain on its own)"
        elif not f["lockstep_measured"]:
            lock = f"≤ {lock} (bound)"
        seeds = list(f["ess_bulk_min_by_seed"].values())
        keys = list(f["ess_bulk_min_by_seed"])
        corr = (
            f"acc {f['acceptance']:.3f}, {f['divergences']} divergences, R-hat max {f['rhat_max']:.4f}, "
            f"mean err {f['mean_err']:.3f}, cov err {f['cov_err']:.3f} (all {f['n_draws']:,} kept draws), "
            f"median ESS {f['ess_bulk_median']:.0f}, min ESS over seeds {keys[0]}–{keys[-1]}: "
            f"{min(seeds):.0f}–{max(seeds):.0f}"
        )
        if f.get("nonfinite_chains"):
            corr += f", **{f['nonfinite_chains']} non-finite chains**"
        if "energy_diff_vs_ebm" in f:
            corr += ", " + format_energy(f)
        lines.append(
            f"| {lib} | {1e3 * r['median_s']:.1f} | {1e3 * r['min_s']:.1f}–{1e3 * r['max_s']:.1f} | "
            f"{1e3 * r['warmup_s']:.1f} | {ratio} | {f['ess_bulk_min']:.0f} | {r['ess_per_s']:,.0f} | {ess_ratio} | "
            f"{f['leapfrog_mean']:.2f}, {f['leapfrog_max']} | {lock} | {corr} |"
        )
    paths = [f"{lib}: {r['path']}" for lib, r in res["results"].items() if r.get("path")]
    if paths:
        lines.append("\nebm's code path — " + "; ".join(paths) + ".")
    return "\n".join(lines)


def table(w: Workload, res: dict) -> str:
    if w.kind == "nuts":
        return nuts_table(w, res)
    if w.kind == "chees":
        return chees_table(w, res)
    rate = w.id in ("S7", "S8")
    per = " per step" if per_call(w) > 1 else ""
    step_col = "ebm-step" in res["results"]
    head = f"| library | median{per} (ms) | min–max (ms) | first call (ms) | peer / ebm |"
    if step_col:
        head += " peer / ebm-step |"
    if rate:
        head += " samples/s |"
    head += " correctness |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for lib, r in res["results"].items():
        ratio = "—" if r["ratio_vs_ebm"] is None else ("1 (ref)" if lib == "ebm" else f"{r['ratio_vs_ebm']:.2f}")
        row = (
            f"| {lib} | {1e3 * r['median_s']:.3f} | {1e3 * r['min_s']:.3f}–{1e3 * r['max_s']:.3f} | "
            f"{1e3 * r['warmup_s']:.1f} | {ratio} |"
        )
        if step_col:
            row += " 1 (ref) |" if lib == "ebm-step" else f" {r['ratio_vs_ebm_step']:.2f} |"
        if rate:
            row += f" {r['samples_per_s'] / 1e3:.1f} K |"
        row += f" {format_figures(w, r['figures'])} |"
        lines.append(row)
    paths = [f"{lib}: {r['path']}" for lib, r in res["results"].items() if r.get("path")]
    if paths:
        lines.append("\nebm's code path — " + "; ".join(paths) + ".")
    return "\n".join(lines)


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next((l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name")), "?")
    except Exception:  # noqa: BLE001 - informational only
        model = platform.processor() or "?"
    return f"{model}, {os.cpu_count()} CPUs"


def git_state() -> dict:
    """The commit measured, and the files that differ from it (the working tree is what runs)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", "-C", root, *a], capture_output=True, text=True, timeout=10).stdout
        except Exception:  # noqa: BLE001 - informational only
            return "?"

    dirty = [
        l[3:]
        for l in git("status", "--porcelain", "--untracked-files=no").splitlines()
        if not l[3:].startswith("benchmarks/results/")
    ]  # results files (this run's own output) are not code
    return {"commit": git("rev-parse", "--short", "HEAD").strip(), "modified": dirty}


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


# ----------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated ids (default: all)")
    ap.add_argument(
        "--libs",
        default=",".join(LIBS),
        help="comma-separated: ebm (default: fused chains where available), ebm-step (fused=False), "
        "ebm-bf16 (W4: the fused chain with bfloat16 products; W5-W7 under autocast=torch.bfloat16), torchebm, blackjax",
    )
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per (workload, library); median reported")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads for torch and XLA (default 1)")
    ap.add_argument("--json", metavar="PATH", help="write raw timings and figures here")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for smoke tests")
    args = ap.parse_args(argv)
    args.workloads = [s.strip().upper() for s in args.workloads.split(",") if s.strip()]
    args.libs = [s.strip().lower() for s in args.libs.split(",") if s.strip()]
    for wid in args.workloads:
        if wid not in WORKLOADS:
            ap.error(f"unknown workload {wid!r}; choose from {', '.join(WORKLOADS)}")
    for lib in args.libs:
        if lib not in LIBS:
            ap.error(f"unknown library {lib!r}; choose from {', '.join(LIBS)}")
    if args.repeats < 1 or args.threads < 1:
        ap.error("--repeats and --threads must be >= 1")
    return args


def thread_names() -> list[str]:
    """The names of this process's threads (Linux; empty elsewhere)."""
    names = []
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
    except OSError:
        pass
    return names


@contextlib.contextmanager
def schedulable_cpus(n: int) -> Any:
    """While inside, this thread (and the threads it starts) may run on ``n`` of the process's CPUs only; on
    leaving, every thread of the process may run on all of them again (Linux; elsewhere nothing happens).

    This is how XLA's CPU client is given ``n`` threads: its intra-op pool (threads ``tf_XLAEigen``, which run
    the compiled program, fusions split across them) is sized when the client is created by the number of CPUs
    the process may run on (``sched_getaffinity``), what ``taskset -c 0 python ...`` sets; there is no flag for
    it (``intra_op_parallelism_threads=1`` in ``XLA_FLAGS``, the line everyone copies, is not an XLA flag and
    changes nothing; ``--xla_cpu_multi_thread_eigen=false`` only makes Eigen's own kernels single-threaded).
    The pool keeps its size once made, so the CPUs are given back afterwards: no library is pinned to a core."""
    if not hasattr(os, "sched_setaffinity"):
        yield
        return
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(allowed)[:n])
    try:
        yield
    finally:
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), allowed)
            except OSError:  # a thread that ended meanwhile
                pass


def configure_threads(threads: int, use_jax: bool) -> dict:
    """Give every library ``threads`` threads; must run before torch and jax are imported. torch:
    ``set_num_threads``; XLA: ``--xla_cpu_multi_thread_eigen`` and a CPU client made while the process may run
    on ``threads`` CPUs only (``schedulable_cpus``), checked by counting its pool's threads
    (``versions["xla_threads"]``). Without the latter XLA runs on as many threads as the machine has CPUs:
    BlackJAX's rows of the runs before 2026-11-28 had 2 threads where ebm and torchebm had 1."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    if use_jax:
        eigen = "false" if threads == 1 else "true"
        os.environ["XLA_FLAGS"] = f"--xla_cpu_multi_thread_eigen={eigen}"
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["JAX_ENABLE_X64"] = "0"
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(threads)
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    if use_jax:
        with schedulable_cpus(threads):
            import jax

            jax.config.update("jax_platforms", "cpu")
            jax.config.update("jax_enable_x64", False)
            devices = jax.devices()  # creates the CPU client, and its thread pool
        import blackjax

        xla_threads = sum(name.startswith("tf_XLAEigen") for name in thread_names())
        if xla_threads != threads:
            print(f"WARNING: XLA has {xla_threads} threads, not {threads}", file=sys.stderr)
        versions.update(
            jax=jax.__version__, blackjax=blackjax.__version__, jax_devices=str(devices), xla_threads=str(xla_threads)
        )
    try:
        import torchebm

        versions["torchebm"] = getattr(torchebm, "__version__", "?")
    except ImportError:
        pass
    import ebmcore

    versions["ebmcore"] = ebmcore.__version__
    try:
        import ebm_cuda

        versions["ebm_cuda"] = ebm_cuda.__version__
        versions["cpu_fused"] = ebm_cuda.host_unavailable_reason() or "available"
    except ImportError:
        versions["ebm_cuda"] = "not installed (ebm has no fused chains: ebm = ebm-step)"
    return versions


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    versions = configure_threads(args.threads, "blackjax" in args.libs)
    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
        "machine": machine(),
        "threads": args.threads,
        "repeats": args.repeats,
        "quick": args.quick,
        "versions": versions,
        "loadavg_start": loadavg(),
        "git": git_state(),
    }
    print(f"# ebm benchmarks — {meta['date']}")
    print(
        f"machine: {meta['machine']}; threads: {args.threads}; repeats: {args.repeats}"
        f"{'; QUICK sizes' if args.quick else ''}; load average at start: {meta['loadavg_start']}"
    )
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    gs = meta["git"]
    print(f"ebm commit: {gs['commit']}" + (f" + uncommitted changes in {', '.join(gs['modified'])}" if gs["modified"] else ""))
    print(f"command: {meta['command']}\n")
    report: dict[str, Any] = {"meta": meta, "workloads": {}}
    for wid in args.workloads:
        w = quick(WORKLOADS[wid]) if args.quick else WORKLOADS[wid]
        t0 = time.perf_counter()
        res = run_workload(w, args.libs, args.repeats)
        res["loadavg_end"] = loadavg()
        report["workloads"][wid] = res
        size = f"{w.n_chains:,} chains, {w.n_steps:,} step{'s' if w.n_steps > 1 else ''}, step size {w.step_size}"
        if w.n_leapfrog:
            size += f", {w.n_leapfrog} leapfrog"
        if w.kind == "nuts":
            size = (
                f"{w.n_chains:,} chains, {w.n_steps:,} NUTS iterations, fixed step size {w.step_size} (no adaptation), "
                f"max tree depth {w.max_tree_depth}, identity mass, float32; ESS = min over the {w.dim} coordinates "
                f"of ebmcore.diagnostics.ess_bulk on the kept trajectory ({w.n_steps}, {w.n_chains}, {w.dim}), "
                "ESS/s = ESS / median time"
            )
        if w.kind == "chees":
            size = (
                f"{w.n_chains:,} chains, {w.n_warmup:,} ChEES warm-up iterations from x0 ~ N(0, I) with initial step size "
                f"{w.step_size:.4f}, then {w.n_steps:,} jittered-HMC iterations with the tuned step size and trajectory "
                f"length, identity mass, float32; each timed run times the warm-up and the sampling separately; "
                f"ESS = min over the {w.dim} coordinates of ebmcore.diagnostics.ess_bulk on the kept trajectory "
                f"({w.n_steps}, {w.n_chains}, {w.dim}); ESS/s = ESS / median sampling time (with warm-up: / the sum of "
                "both medians); ESS per gradient = ESS / (chains × gradient evaluations per chain while sampling)"
            )
            if w.target == "logistic":
                size += f"; dataset: {w.n_rows:,} rows, X ~ N(0, 1/{w.dim}), y ~ Bernoulli(sigmoid(X β*)), seed {SEED_LOGISTIC}"
        if w.kind.endswith("_step"):
            size += f"; {w.inner} successive steps per timed run, time per step reported"
        if w.kind in LOSS_KINDS:
            size = f"batch {w.n_chains:,} of 2-d data (eight Gaussians, fixed), float32"
            size += {
                "cd": f", CD-{w.n_steps}: {w.n_steps} Langevin steps of size {w.step_size} from the data, Adam lr {w.lr}",
                "ssm": f", {w.n_projections} projection ({w.projection}), no variance reduction",
                "dsm": f", sigma {w.sigma}",
            }[w.kind]
            size += (
                f"; {w.inner} successive training steps per timed run, each run from the initial weights and a fresh optimizer"
                if w.kind == "cd"
                else f"; {w.inner} successive loss + backward calls per timed run (weights fixed)"
            )
            size += "; time per step reported, 'first call' = the whole warm-up run"
        print(f"## {wid}: {w.what}\n\n{size}." + (f" The guides' figure: {w.guide}." if w.guide else "") + "\n")
        print(table(w, res))
        print(f"\n({time.perf_counter() - t0:.0f} s for this workload; load average now {res['loadavg_end']})\n", flush=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
        print(f"raw results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
