"""Issue 40's probe sweep, rerun: every public entry point given the issue's classes of bad input, each call ending in
a right result (compared with plain autograd or the exact value where that is cheap) or an ``ebmcore`` error whose
message names the problem, never in a silent wrong result or a foreign traceback (AttributeError, a RuntimeError
from torch, ZeroDivisionError, ...).

The entry points: every registered sampler and loss (enumerated from the registry, so a new plugin's are probed as
they are installed), every registered energy's constructor, ``EnergyModel.bind(x).energy/gradient`` and the checked
``energy``/``gradient``, ``Trainer``, the image loaders (``.npz``, ``.pt``, PNG folders), energy matching's and
equilibrium matching's samplers, the ``ebm.toml`` configuration and the CLI's ``main`` in-process.

Each call is classified by :func:`probe` and counted per entry point; ``pytest -s tests/test_entry_point_contracts.py``
prints the table (right / clear / silent / traceback) at the end. Under the ``ci`` profile (the default) the sweep is
derandomised and small; ``--hypothesis-profile=explore`` runs 20× the examples at random. ``EBM_PROBE_COUNT_ONLY=1``
counts without failing (how the table of a tree with known failures is made).
"""

from __future__ import annotations

import inspect
import io
import math
import os
import warnings
from collections import Counter, defaultdict
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ebmcore
from ebmcore import EnergyModel, SequentialEnergy, registry
from ebmcore.errors import EBMError
from ebmcore.recording import NonFiniteChainsWarning

COUNT_ONLY = bool(os.environ.get("EBM_PROBE_COUNT_ONLY"))  # read at import: the autouse fixture clears EBM_* later
OUTCOMES = ("right", "clear", "silent", "traceback")
TALLY: dict[str, Counter] = defaultdict(Counter)
FOUND: dict[str, list[str]] = defaultdict(list)


def scaled(n: int) -> settings:
    """``n`` examples under the ``ci`` profile (100 examples by default), proportionally more under ``explore``."""
    return settings(max_examples=max(n, n * settings.default.max_examples // 100))


class Silent(AssertionError):
    """A call returned where it should have raised, or returned a wrong result."""


def probe(entry: str, label: str, call, check=None, *, must_fail: bool = False):
    """Run ``call()`` and classify it for ``entry``: ``clear`` (an ``EBMError`` with a message, or argparse's exit 2),
    ``right`` (returned and ``check(result)`` holds), ``silent`` (returned although ``must_fail``, or ``check`` failed)
    or ``traceback`` (any other exception). Silent and traceback fail the test unless ``EBM_PROBE_COUNT_ONLY``."""
    error = None
    result = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = call()
        except EBMError as err:
            outcome = "clear" if len(str(err)) > 20 else "traceback"
            error = err
        except SystemExit as exc:  # argparse's usage error: a message and exit status 2
            outcome = "clear" if exc.code == 2 else "traceback"
            error = exc
        except Exception as exc:  # noqa: BLE001 - what the sweep looks for
            outcome, error = "traceback", exc
        else:
            outcome = "right"
            if must_fail:
                outcome, error = "silent", Silent(f"returned {type(result).__name__} where an error was due")
            elif check is not None:
                try:
                    check(result, caught)
                except Exception as exc:  # noqa: BLE001
                    outcome, error = "silent", exc
    TALLY[entry][outcome] += 1
    if outcome in ("silent", "traceback"):
        what = f"{label}: {type(error).__name__}: {str(error)[:300]}"
        if len(FOUND[entry]) < 8 and what not in FOUND[entry]:
            FOUND[entry].append(what)
        if not COUNT_ONLY:
            raise AssertionError(f"{entry} [{outcome}] {what}") from error
    return error if error is not None else result


@pytest.fixture(scope="module", autouse=True)
def summary_table():
    """The per-entry-point counts, printed after the module's tests (shown by ``pytest -s``)."""
    yield
    width = max((len(e) for e in TALLY), default=10)
    lines = ["", f"{'entry point':<{width}}  " + "  ".join(f"{o:>9}" for o in OUTCOMES)]
    total = Counter()
    for entry in sorted(TALLY):
        total.update(TALLY[entry])
        lines.append(f"{entry:<{width}}  " + "  ".join(f"{TALLY[entry][o]:>9}" for o in OUTCOMES))
    lines.append(f"{'total':<{width}}  " + "  ".join(f"{total[o]:>9}" for o in OUTCOMES))
    for entry in sorted(FOUND):
        lines += [f"  {entry}: {w}" for w in FOUND[entry]]
    print("\n".join(lines))


# -- the vocabulary of bad inputs ---------------------------------------------------------------------------------

ODD_NUMBERS = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, 0.0, -0.5, 1e-300, 1e300, math.nan, math.inf, -math.inf, 2**70, "1", "x", "", [1], (), {}]),
    st.builds(lambda v: torch.tensor(v), st.sampled_from([0.1, math.nan])),
    st.builds(lambda v: np.float64(v), st.sampled_from([0.1, math.nan, -1.0])),
)
FLOAT_DTYPES = [torch.float32, torch.float64]
ODD_DTYPES = [torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool, torch.complex64, torch.uint8]


@st.composite
def batches(draw, event=(2,), dtype=torch.float32):
    """``(n, *event)`` with at most one thing odd: shape, dtype, device (meta), a NaN or inf, empty, huge, not a tensor."""
    fault = draw(st.sampled_from(["none", "none", "shape", "dtype", "meta", "non-finite", "empty", "huge", "list"]))
    shape = (draw(st.integers(1, 4)), *event)
    if fault == "shape":
        shape = draw(st.sampled_from([shape[1:], (*shape, 1), (shape[0], *[e + 1 for e in event]), ()]))
    elif fault == "empty":
        shape = (0, *event)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 9))))
    if fault == "huge":
        x = x * 1e30
    if fault == "non-finite" and x.numel():
        x.view(-1)[draw(st.integers(0, x.numel() - 1))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    if fault == "list":
        return fault, x.tolist()
    if fault == "dtype":
        x = x.to(draw(st.sampled_from(ODD_DTYPES)))
        fault = "dtype-float" if x.is_floating_point() else "dtype"
    else:
        x = x.to(dtype)
    return fault, (x.to("meta") if fault == "meta" else x)


def bad_x(fault: str, energy=None) -> bool:
    """Whether a batch with this fault (:func:`batches`) must be refused: another floating dtype only by an energy
    that holds parameters or buffers (their dtype fixes the input's)."""
    if fault == "dtype-float":
        return energy is None or energy._reference_tensor() is not None
    return fault in ("shape", "dtype", "meta", "non-finite", "list")


ODD_GENERATORS = st.sampled_from(["none", "int", "str", "numpy", "python", "seeded"])


def generator_of(kind: str):
    return {
        "none": None,
        "int": 3,
        "str": "cpu",
        "numpy": np.random.default_rng(0),
        "python": __import__("random").Random(0),
        "seeded": torch.Generator().manual_seed(0),
    }[kind]


def finite(t) -> bool:
    return isinstance(t, torch.Tensor) and bool(torch.isfinite(t).all())


# -- energies with a fault in their own code, parameters or structure ---------------------------------------------


class Quadratic(EnergyModel):
    """``E = ½|x|²`` with an optional fault in ``compute_gradient`` (the user's own code)."""

    event_shape = (2,)

    def __init__(self, fault: str = "none") -> None:
        super().__init__()
        self.fault = fault

    def compute_energy(self, x):
        return 0.5 * x.square().sum(1)

    def compute_gradient(self, x, create_graph=False):
        f = self.fault
        if f == "none":
            return x.clone()
        if f == "returns-none":
            return None
        if f == "int":
            return x.long()
        if f == "float64":
            return x.double()
        if f == "float16":
            return x.half()
        if f == "complex":
            return x.to(torch.complex64)
        if f == "wrong-shape":
            return x.flatten()
        if f == "scalar":
            return x.sum()
        if f == "list":
            return x.tolist()
        if f == "nan":
            return torch.full_like(x, math.nan)
        raise AssertionError(f)


GRADIENT_FAULTS = ["returns-none", "int", "float64", "float16", "complex", "wrong-shape", "scalar", "list", "nan"]


class BadEnergyOutput(EnergyModel):
    event_shape = (2,)

    def __init__(self, fault: str) -> None:
        super().__init__()
        self.fault = fault

    def compute_energy(self, x):
        e = 0.5 * x.square().sum(1)
        return {
            "returns-none": None,
            "int": e.long(),
            "column": e.unsqueeze(1),
            "sum": e.sum(),
            "detached": e.detach(),
            "nan": e * math.nan,
        }[self.fault]


ENERGY_OUTPUT_FAULTS = ["returns-none", "int", "column", "sum", "detached", "nan"]


def _network(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(2, 8), nn.SiLU(), nn.Linear(8, 1))


class _Scale(nn.Module):
    def forward(self, w):
        return 2 * w


def model_with(fault: str) -> EnergyModel:
    """A small network energy with one thing done to it after it was built (or none)."""
    if fault == "opaque-mixed-dtype":

        class TwoDtypes(EnergyModel):
            event_shape = (2,)

            def __init__(self):
                super().__init__()
                self.a, self.b = nn.Linear(2, 8), nn.Linear(8, 1).double()

            def compute_energy(self, x):
                return self.b(torch.tanh(self.a(x))).squeeze(-1)

        return TwoDtypes()
    net = _network()
    energy = SequentialEnergy(net)
    if fault == "backward-hook":
        net[2].register_full_backward_hook(lambda m, gi, go: (gi[0] * 3,))
    elif fault == "backward-pre-hook":
        net[2].register_full_backward_pre_hook(lambda m, go: (go[0] * 3,))
    elif fault == "forward-hook":
        net[0].register_forward_hook(lambda m, i, o: o * 2)
    elif fault == "forward-pre-hook":
        net[0].register_forward_pre_hook(lambda m, i: (i[0] * 2,))
    elif fault == "parametrization":
        torch.nn.utils.parametrize.register_parametrization(net[0], "weight", _Scale())
    elif fault == "mixed-dtype":
        net[2].double()
    elif fault == "half-layer":
        net[0].half()
    elif fault == "nan-parameter":
        with torch.no_grad():
            net[0].weight[0, 0] = math.nan
    elif fault == "inf-parameter":
        with torch.no_grad():
            net[2].bias[0] = math.inf
    elif fault == "meta":
        energy = energy.to("meta")
    elif fault == "float64":
        energy = energy.double()
    return energy


MODEL_FAULTS = [
    "none",
    "backward-hook",
    "backward-pre-hook",
    "forward-hook",
    "forward-pre-hook",
    "parametrization",
    "mixed-dtype",
    "half-layer",
    "nan-parameter",
    "inf-parameter",
    "meta",
    "float64",
    "opaque-mixed-dtype",
]
MUST_FAIL_MODELS = {"mixed-dtype", "half-layer", "nan-parameter", "inf-parameter", "meta", "opaque-mixed-dtype"}


def reference(energy: EnergyModel, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain autograd on ``compute_energy`` (hooks and parametrizations included)."""
    xg = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        e = energy.compute_energy(xg)
        (g,) = torch.autograd.grad(e.sum(), xg)
    return e.detach(), g


# -- energies: the registry's constructors ------------------------------------------------------------------------


def _parameters(component) -> list[str]:
    target = component.__init__ if isinstance(component, type) else component
    try:
        return [p for p in inspect.signature(target).parameters if p not in ("self", "args", "kwargs")]
    except (TypeError, ValueError):
        return []


def _component(kind: str, name: str):
    entry = registry.get(kind, name)
    return getattr(entry, "component", None) or getattr(entry, "obj", None) or entry


SMALL_ENERGIES = {"conv", "gaussian_residual", "image_mlp", "joint_energy"}  # image models: probed at their defaults


@scaled(60)
@given(name=st.sampled_from(registry.names("energy")), data=st.data())
def test_every_registered_energy_is_built_right_or_refused(name, data):
    keys = _parameters(_component("energy", name)) + ["unknown"]
    params = data.draw(st.dictionaries(st.sampled_from(keys), ODD_NUMBERS, max_size=2), label="params")
    if name in SMALL_ENERGIES:
        params = {k: v for k, v in params.items() if k in ("dtype", "device", "unknown", "seed")}

    def check(energy, caught):
        assert isinstance(energy, EnergyModel)
        x = torch.randn(3, *energy.event_shape, dtype=next((p.dtype for p in energy.parameters()), torch.float32))
        e, g = energy.energy_and_gradient(x)
        assert finite(e) and finite(g), "a built energy gives non-finite values at ordinary points"

    probe(f"energy:{name}", repr(params), lambda: registry.get("energy", name)(**params), check)


# -- energy(x), gradient(x), bind(x) ------------------------------------------------------------------------------


@scaled(50)
@given(fault=st.sampled_from(MODEL_FAULTS), method=st.sampled_from(["bind", "energy", "gradient"]), seed=st.integers(0, 3))
def test_energy_gradient_and_bind_agree_with_autograd_or_refuse(fault, method, seed):
    energy = model_with(fault)
    x = torch.randn(4, 2, generator=torch.Generator().manual_seed(seed))
    if fault == "float64":
        x = x.double()

    def run():
        if method == "bind":
            fns = energy.bind(x)
            return fns.energy(x), fns.gradient(x)
        return energy.energy(x) if method == "energy" else energy.gradient(x)

    def check(out, caught):
        e_ref, g_ref = reference(energy, x)
        if method == "bind":
            torch.testing.assert_close(out[0], e_ref, equal_nan=True)
            torch.testing.assert_close(out[1], g_ref, equal_nan=True)
        else:
            torch.testing.assert_close(out, e_ref if method == "energy" else g_ref)
            assert finite(out), "a checked method handed back a non-finite value"

    unchecked = method == "bind" and fault in ("nan-parameter", "inf-parameter")  # bind's callables: as autograd
    finite_anyway = method == "gradient" and fault == "inf-parameter"  # an infinite bias has a finite gradient
    probe(f"EnergyModel.{method}", fault, run, check, must_fail=fault in MUST_FAIL_MODELS and not (unchecked or finite_anyway))


@scaled(40)
@given(
    name=st.sampled_from(["gaussian", "double_well", "mlp", "rosenbrock"]),
    x=batches(),
    method=st.sampled_from(["energy", "gradient"]),
)
def test_checked_energy_methods_on_bad_x(name, x, method):
    fault, x = x
    energy = ebmcore.energy(name, dim=2) if name != "mlp" else ebmcore.energy("mlp", dim=2, hidden=[4])

    def check(out, caught):
        e_ref, g_ref = reference(energy, x)
        torch.testing.assert_close(out, e_ref if method == "energy" else g_ref)
        assert finite(out), "a non-finite energy or gradient handed back"

    probe(
        f"EnergyModel.{method}(x)",
        fault,
        lambda: getattr(energy, method)(x),
        check,
        must_fail=bad_x(fault, energy),
    )


# -- samplers: every registered one --------------------------------------------------------------------------------

SAMPLER_NAMES = registry.names("sampler")


def _sample_check(x0):
    def check(out, caught):
        samples = getattr(out, "samples", out)
        assert isinstance(samples, torch.Tensor) and samples.shape == x0.shape and samples.dtype == x0.dtype
        if not finite(samples):  # said, not silent
            assert any(issubclass(w.category, NonFiniteChainsWarning) for w in caught), "non-finite samples, unsaid"

    return check


@scaled(60)
@given(name=st.sampled_from(SAMPLER_NAMES), data=st.data())
def test_every_registered_sampler_is_built_from_odd_settings_right_or_refused(name, data):
    keys = [k for k in _parameters(_component("sampler", name)) if k != "energy"] + ["unknown"]
    params = data.draw(st.dictionaries(st.sampled_from(keys), ODD_NUMBERS, min_size=1, max_size=2), label="params")
    x0 = torch.randn(3, 2)

    def run():
        sampler = registry.get("sampler", name)(ebmcore.energy("gaussian", dim=2), **params)
        return sampler.sample(x0, 2, generator=torch.Generator().manual_seed(0))

    probe(f"sampler:{name}", repr(params), run, _sample_check(x0))


@scaled(120)
@given(
    name=st.sampled_from(SAMPLER_NAMES),
    fault=st.sampled_from(["gradient", "gradient", "energy-output", "model", "x0", "generator", "callback", "run", "tunable"]),
    data=st.data(),
)
def test_every_registered_sampler_samples_right_or_refuses(name, fault, data):
    """One thing odd at a time: the energy's own gradient or output, the model, ``x0``, the generator, the callback,
    ``n_steps``/``burn_in``/``thin``, a tunable."""
    energy, x0, kwargs, must_fail = Quadratic(), torch.randn(3, 2), {}, False
    n_steps, label = 2, fault
    if fault == "gradient":
        label = data.draw(st.sampled_from(GRADIENT_FAULTS))
        energy, must_fail = Quadratic(label), label != "nan"
    elif fault == "energy-output":
        label = data.draw(st.sampled_from(ENERGY_OUTPUT_FAULTS))
        energy, must_fail = BadEnergyOutput(label), label != "nan"
    elif fault == "model":
        label = data.draw(st.sampled_from(MODEL_FAULTS))
        energy, must_fail = model_with(label), label in MUST_FAIL_MODELS
        if label == "float64":
            x0 = x0.double()
    elif fault == "x0":
        label, x0 = data.draw(batches())
        must_fail = bad_x(label, energy) or label == "empty"
    elif fault == "generator":
        label = data.draw(ODD_GENERATORS)
        kwargs["generator"] = generator_of(label)
        must_fail = label in ("int", "str", "numpy", "python")
    elif fault == "callback":
        label = data.draw(st.sampled_from(["42", "str", "none"]))
        kwargs["callback"] = {"42": 42, "str": "print", "none": None}[label]
        must_fail = label != "none"
    elif fault == "run":
        key = data.draw(st.sampled_from(["n_steps", "burn_in", "thin"]))
        value = data.draw(st.one_of(ODD_NUMBERS, st.integers(-1, 3)))
        label = f"{key}={value!r}"
        if key == "n_steps":
            n_steps = value
        else:
            kwargs[key] = value
        must_fail = not (isinstance(value, int) and not isinstance(value, bool) and value >= (1 if key == "thin" else 0))
        if key == "thin" and not must_fail and value > 2:
            must_fail = None  # more thinning than steps: an error or no draws, both fine
    elif fault == "tunable":
        key = data.draw(st.sampled_from(["step_size", "temperature", "unknown"]))
        value = data.draw(ODD_NUMBERS)
        label = f"{key}={value!r}"
        kwargs[key] = value
    kwargs.setdefault("generator", torch.Generator().manual_seed(0))

    def run():
        sampler = registry.get("sampler", name)(energy)
        return sampler.sample(x0, n_steps, **kwargs)

    check = _sample_check(x0) if isinstance(x0, torch.Tensor) else None
    probe(f"sampler:{name}", label, run, check, must_fail=bool(must_fail))


# -- losses: every registered one -----------------------------------------------------------------------------------


def _energy_for(name: str):
    """The first of a few small energies this loss trains (a new plugin's loss finds its own among them)."""
    for make in (
        lambda: ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0),
        lambda: ebmcore.energy("gaussian_residual", event_shape=[2], hidden=[8]).fit_base(
            torch.randn(32, 2, generator=torch.Generator().manual_seed(2))
        ),
        lambda: ebmcore.energy("joint_energy"),
    ):
        energy = make()
        data = torch.randn(8, *energy.event_shape, generator=torch.Generator().manual_seed(1))
        kw = {"labels": torch.arange(8) % 2} if getattr(registry.get("loss", name)(), "needs_labels", False) else {}
        try:
            registry.get("loss", name)()(energy, data, generator=torch.Generator().manual_seed(0), **kw)
        except EBMError:
            continue
        return make, kw
    return None, {}


LOSS_NAMES = registry.names("loss")
LOSS_ENERGY = {name: _energy_for(name) for name in LOSS_NAMES}


@scaled(120)
@given(name=st.sampled_from(LOSS_NAMES), fault=st.sampled_from(["options", "data", "data", "generator", "model"]), data=st.data())
def test_every_registered_loss_gives_a_finite_differentiable_scalar_or_refuses(name, fault, data):
    make, kw = LOSS_ENERGY[name]
    assert make is not None, f"no small energy trains with {name}"
    energy = make()
    batch = torch.randn(8, *energy.event_shape, generator=torch.Generator().manual_seed(1))
    options, generator, must_fail, label = {}, torch.Generator().manual_seed(0), False, fault
    if fault == "options":
        keys = _parameters(_component("loss", name)) + ["unknown"]
        options = data.draw(st.dictionaries(st.sampled_from(keys), ODD_NUMBERS, min_size=1, max_size=2))
        label = repr(options)
    elif fault == "data":
        label, batch = data.draw(batches(event=energy.event_shape))
        must_fail = bad_x(label, energy) or label == "empty"
    elif fault == "generator":
        label = data.draw(ODD_GENERATORS)
        generator = generator_of(label)
        must_fail = label in ("int", "str", "numpy", "python")
    elif fault == "model" and energy.event_shape == (2,):
        label = data.draw(st.sampled_from(["nan-parameter", "inf-parameter", "mixed-dtype", "meta"]))
        must_fail = label in ("nan-parameter", "mixed-dtype", "meta")  # an inf bias may leave a finite loss
        energy = model_with(label)

    def run():
        loss = registry.get("loss", name)(**options)
        return loss(energy, batch, generator=generator, **kw)

    def check(value, caught):
        assert isinstance(value, torch.Tensor) and value.shape == () and finite(value) and value.requires_grad
        value.backward()
        grads = [p.grad for p in energy.parameters() if p.grad is not None]
        assert all(finite(g) for g in grads), "a finite loss with a non-finite gradient"

    probe(f"loss:{name}", label, run, check, must_fail=must_fail)


@pytest.mark.parametrize("seed", range(3))
def test_exact_score_matching_equals_hyvarinens_objective_by_autograd(seed):
    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=seed)
    x = torch.randn(6, 2, generator=torch.Generator().manual_seed(seed))
    got = registry.get("loss", "score_matching")(method="exact")(energy, x)
    terms = []
    for row in x:
        xr = row.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(energy.compute_energy(xr[None]).sum(), xr, create_graph=True)
        trace = sum(torch.autograd.grad(g[i], xr, retain_graph=True)[0][i] for i in range(2))
        terms.append(0.5 * g.square().sum() - trace)
    torch.testing.assert_close(got, torch.stack(terms).mean())


# -- energy matching's and equilibrium matching's samplers ----------------------------------------------------------


@scaled(40)
@given(
    which=st.sampled_from(["energy_matching.generate", "equilibrium_matching.descend"]),
    key=st.sampled_from(["x0", "n_steps", "temperature", "tau_star", "step_size", "momentum", "generator"]),
    data=st.data(),
)
def test_the_flow_samplers_give_finite_points_or_refuse(which, key, data):
    from ebm_losses import energy_matching, equilibrium_matching

    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    x0, kwargs, must_fail = torch.randn(4, 2), {"n_steps": 3}, False
    own = {"energy_matching.generate": {"n_steps", "temperature", "tau_star", "generator"}}
    own["equilibrium_matching.descend"] = {"n_steps", "step_size", "momentum"}
    if key == "x0":
        label, x0 = data.draw(batches())
        must_fail = bad_x(label, energy) or label == "empty"
    elif key in own[which]:
        value = generator_of(data.draw(ODD_GENERATORS)) if key == "generator" else data.draw(ODD_NUMBERS)
        kwargs[key] = value
        label = f"{key}={value!r}"
    else:
        label = "none"
    fn = energy_matching.generate if which.startswith("energy") else equilibrium_matching.descend

    def check(out, caught):
        assert isinstance(out, torch.Tensor) and out.shape == x0.shape and finite(out)

    probe(which, label, lambda: fn(energy, x0, **kwargs), check, must_fail=must_fail)


# -- Trainer -------------------------------------------------------------------------------------------------------

TRAINER_KEYS = [
    "batch_size",
    "lr",
    "seed",
    "ema_decay",
    "clip_grad_norm",
    "progress",
    "eval_every",
    "checkpoint_every",
    "optimizer",
    "watchdog",
    "live_log",
    "labels",
]


@scaled(60)
@given(fault=st.sampled_from(["argument", "argument", "data", "n_steps", "model"]), data=st.data())
def test_trainer_trains_finitely_or_refuses(tmp_path, fault, data):
    from ebm_losses.training import Trainer

    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    batch = torch.randn(16, 2, generator=torch.Generator().manual_seed(1))
    kwargs, n_steps, label, must_fail = {"batch_size": 8}, 2, fault, False
    if fault == "argument":
        key = data.draw(st.sampled_from(TRAINER_KEYS))
        value = data.draw(st.one_of(ODD_NUMBERS, st.sampled_from(["adam", torch.optim.SGD, 42, lambda p: None])))
        kwargs[key] = value
        label = f"{key}={value!r}"
        if key == "eval_every":
            kwargs["eval_fn"] = lambda energy, step: {"x": 1.0}
        if key == "checkpoint_every":
            kwargs["checkpoint_path"] = tmp_path / "ckpt.pt"
    elif fault == "data":
        label, batch = data.draw(batches())
        must_fail = bad_x(label, energy) or label == "empty"
        if label == "huge":
            must_fail = None
    elif fault == "n_steps":
        n_steps = data.draw(st.one_of(ODD_NUMBERS, st.integers(-1, 2)))
        label = f"n_steps={n_steps!r}"
        must_fail = not (isinstance(n_steps, int) and not isinstance(n_steps, bool) and 0 <= n_steps <= 3)
    elif fault == "model":
        label = data.draw(st.sampled_from(["nan-parameter", "mixed-dtype", "meta", "backward-hook"]))
        energy, must_fail = model_with(label), label != "backward-hook"

    def run():
        loss = registry.get("loss", "denoising_score_matching")()
        trainer = Trainer(energy, loss, batch, **{"watchdog": False, **kwargs})
        return trainer.fit(n_steps)

    def check(history, caught):
        values = [v for v in getattr(history, "loss", []) if v is not None]
        assert all(math.isfinite(v) for v in values), f"non-finite losses {values}"
        assert all(finite(p) for p in energy.parameters()), "non-finite parameters after training"

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probe("Trainer", label, run, check, must_fail=bool(must_fail))


# -- image loaders -------------------------------------------------------------------------------------------------

NPZ_CASES = {
    "uint8": lambda: np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4),
    "uint16": lambda: (np.arange(2 * 4 * 4, dtype=np.uint16) * 2000).reshape(2, 4, 4),
    "int64": lambda: np.arange(2 * 4 * 4, dtype=np.int64).reshape(2, 4, 4),
    "int64-negative": lambda: np.arange(2 * 4 * 4, dtype=np.int64).reshape(2, 4, 4) - 5,
    "float32-unit": lambda: np.linspace(0, 1, 32, dtype=np.float32).reshape(2, 4, 4),
    "float64": lambda: np.linspace(-3, 3, 32).reshape(2, 4, 4),
    "float16": lambda: np.linspace(0, 1, 32).astype(np.float16).reshape(2, 4, 4),
    "bool": lambda: np.arange(32).reshape(2, 4, 4) % 2 == 0,
    "complex64": lambda: (np.ones((2, 4, 4)) * (1 + 2j)).astype(np.complex64),
    "nan": lambda: np.where(np.arange(32).reshape(2, 4, 4) == 3, np.nan, 0.5).astype(np.float32),
    "inf": lambda: np.where(np.arange(32).reshape(2, 4, 4) == 3, np.inf, 0.5).astype(np.float32),
    "empty": lambda: np.zeros((0, 4, 4), dtype=np.float32),
    "constant": lambda: np.full((2, 4, 4), 7.0, dtype=np.float32),
    "strings": lambda: np.array([["a", "b"]]),
    "1-d": lambda: np.arange(5, dtype=np.float32),
    "nhwc-rgb": lambda: np.linspace(0, 1, 2 * 4 * 5 * 3, dtype=np.float32).reshape(2, 4, 5, 3),
    "huge": lambda: np.full((2, 4, 4), 1e30, dtype=np.float32) * np.arange(1, 3, dtype=np.float32)[:, None, None],
}
MUST_FAIL_NPZ = {"complex64", "nan", "inf", "strings", "1-d", "constant"}


def _check_images(expected: np.ndarray):
    from ebm_losses.images import to_model_range

    def check(loaded, caught):
        images = loaded.images
        want = torch.from_numpy(np.ascontiguousarray(expected)).float()
        if want.dim() == 3:
            want = want.unsqueeze(1)
        elif want.shape[-1] in (1, 3, 4) and want.shape[1] not in (1, 3, 4):
            want = want.permute(0, 3, 1, 2)
        torch.testing.assert_close(images, want, rtol=0, atol=0)  # values as stored, no precision lost
        low, high = loaded.pixel_range
        assert math.isfinite(low) and math.isfinite(high) and low <= high, f"pixel range {loaded.pixel_range}"
        if images.numel():
            assert finite(to_model_range(images, loaded.pixel_range)), "the model range of finite images is not finite"

    return check


@pytest.mark.parametrize("case", sorted(NPZ_CASES))
def test_npz_and_pt_loading_keeps_the_values_or_refuses(tmp_path, case):
    from ebm_losses import images

    array = NPZ_CASES[case]()
    np.savez(tmp_path / "a.npz", images=array)
    probe(
        "images.load_array(.npz)",
        case,
        lambda: images.load_array(tmp_path / "a.npz"),
        _check_images(array),
        must_fail=case in MUST_FAIL_NPZ,
    )
    if array.dtype.kind in "fiucb" and array.dtype != np.uint16:
        torch.save(torch.from_numpy(array.copy()), tmp_path / "a.pt")
        probe(
            "images.load_array(.pt)",
            case,
            lambda: images.load_array(tmp_path / "a.pt"),
            _check_images(array),
            must_fail=case in MUST_FAIL_NPZ,
        )


@pytest.mark.parametrize("case", ["empty-file", "garbage", "pickled-object", "wrong-key", "two-arrays", "missing", "directory"])
def test_broken_array_files_are_refused(tmp_path, case):
    from ebm_losses import images

    path = tmp_path / "a.npz"
    if case == "empty-file":
        path.write_bytes(b"")
    elif case == "garbage":
        path.write_bytes(b"PK\x03\x04 not a zip at all")
    elif case == "pickled-object":
        np.savez(path, images=np.array([{"a": 1}], dtype=object))
    elif case == "wrong-key":
        np.savez(path, labels=np.zeros(3), other=np.zeros(3))
    elif case == "two-arrays":
        np.savez(path, a=np.zeros((2, 4, 4)), b=np.zeros((2, 4, 4)))
    elif case == "directory":
        path = tmp_path
    probe("images.load_array(.npz)", case, lambda: images.load_array(path), must_fail=True)


def _png_folder(tmp_path, case):
    from PIL import Image

    folder = tmp_path / case
    folder.mkdir()
    arrays = []
    if case in ("gray8", "gray16", "rgb8", "palette", "mixed-size", "mixed-depth", "rgba8"):
        for k in range(2):
            if case == "gray16" or (case == "mixed-depth" and k == 1):
                a = (np.arange(12, dtype=np.uint16).reshape(3, 4) * 5000 + k).astype(np.uint16)
                Image.fromarray(a.astype(np.uint16)).save(folder / f"{k}.png")
            elif case in ("rgb8", "rgba8"):
                a = (np.arange(3 * 4 * 3).reshape(3, 4, 3) * 7 + k).astype(np.uint8)
                Image.fromarray(a, "RGB").convert("RGBA" if case == "rgba8" else "RGB").save(folder / f"{k}.png")
                a = a
            elif case == "palette":
                a = (np.arange(12).reshape(3, 4) * 20 + k).astype(np.uint8)
                Image.fromarray(a, "L").convert("P").save(folder / f"{k}.png")
                a = np.asarray(Image.open(folder / f"{k}.png").convert("L"))
            else:
                side = 4 + k if case == "mixed-size" else 4
                a = (np.arange(3 * side).reshape(3, side) * 20 + k).astype(np.uint8)
                Image.fromarray(a, "L").save(folder / f"{k}.png")
            arrays.append(a)
    elif case == "corrupt":
        (folder / "0.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    elif case == "zero-bytes":
        (folder / "0.png").write_bytes(b"")
    return folder, (
        np.stack(arrays) if arrays and len({a.shape for a in arrays}) == 1 and len({a.dtype for a in arrays}) == 1 else None
    )


@pytest.mark.parametrize(
    "case", ["gray8", "gray16", "rgb8", "rgba8", "palette", "mixed-size", "mixed-depth", "corrupt", "zero-bytes", "empty-folder"]
)
def test_png_folders_load_their_values_or_refuse(tmp_path, case):
    pytest.importorskip("PIL")
    from ebm_losses import images

    folder, expected = _png_folder(tmp_path, case)
    must_fail = case in ("mixed-size", "mixed-depth", "corrupt", "zero-bytes", "empty-folder")

    def check(loaded, caught):
        if case == "rgba8":  # the alpha channel is dropped (RGB), the colour kept
            exp = expected[..., :3]
        else:
            exp = expected
        _check_images(exp)(loaded, caught)
        assert loaded.pixel_range == ((0.0, 65535.0) if case == "gray16" else (0.0, 255.0))

    probe("images.load_png_folder", case, lambda: images.load_png_folder(folder), check, must_fail=must_fail)
    probe("images.load", case, lambda: images.load(str(folder)), check, must_fail=must_fail)


# -- ebm.toml ------------------------------------------------------------------------------------------------------


@scaled(30)
@given(
    key=st.sampled_from(["backends", "disable_plugins", "disable_plugin_autoload", "unknown", "threads", "device"]),
    value=st.sampled_from(['"torch"', '"cuda,torch"', '""', '","', "3", "true", "nan", '["a", 1]', "{x = 1}", '"x"', "[]"]),
    env=st.sampled_from([None, ("EBM_DISABLE_PLUGIN_AUTOLOAD", "maybe"), ("EBM_DISABLE_PLUGINS", ",,"), ("EBM_BACKEND", "nope")]),
)
def test_the_ebm_toml_configuration_loads_or_refuses(key, value, env, monkeypatch):
    import ebmcore.config as config

    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp())
    (folder / "ebm.toml").write_text(f"{key} = {value}\n")
    monkeypatch.chdir(folder)
    if env is not None:
        monkeypatch.setenv(*env)

    def check(loaded, caught):
        assert isinstance(loaded, config.Config)

    probe("ebmcore.config", f"{key} = {value} {env}", config.load_config, check)


# -- the CLI, in-process ----------------------------------------------------------------------------------------------

CLI_CASES = {
    "no-such-command": (["frobnicate"], True),
    "sample-missing-config": (["sample", "no-such.toml"], True),
    "sample-threads-huge": (["sample", "--threads", "100000", "--n-steps", "1", "--n-chains", "1", "--format", "none"], True),
    "sample-threads-negative": (["sample", "--threads", "-1"], True),
    "sample-threads-text": (["sample", "--threads", "x"], True),
    "sample-device-meta": (["sample", "--device", "meta", "--n-steps", "1"], True),
    "sample-step-size-nan": (["sample", "--step-size", "nan", "--n-steps", "1"], True),
    "sample-n-chains-negative": (["sample", "--n-chains", "-3"], True),
    "sample-unknown-sampler": (["sample", "--sampler", "nope"], True),
    "train-unknown-config": (["train", "nope"], True),
    "sample-bad-toml": (["sample", "BAD_TOML"], True),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_the_cli_refuses_bad_arguments_with_a_message(tmp_path, case):
    from ebmcore.cli import main

    argv, must_fail = CLI_CASES[case]
    argv = [str(tmp_path / "bad.toml") if a == "BAD_TOML" else a for a in argv]
    (tmp_path / "bad.toml").write_text("[sampler]\nname = 'mala'\nstep_size = nan\n[energy\n")
    argv = [*argv[:1], "--out", str(tmp_path / "out"), *argv[1:]] if argv[0] in ("sample", "train") else argv
    err = io.StringIO()

    def run():
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            code = main(argv)
        if code == 2 and len(err.getvalue().strip()) > 20:
            raise _CLIRefused(err.getvalue().strip())
        return code

    probe("ebm (cli.main)", case, run, must_fail=must_fail)


class _CLIRefused(EBMError):
    """The CLI's exit status 2 with its one-line message (what a user sees), as a clear error."""


# -- what this sweep found, pinned (each was a traceback from inside torch or Python, or a silent result) ------------


def test_a_loss_refuses_a_model_with_a_nan_parameter_naming_it():
    from ebmcore.errors import NonFiniteError

    for name in ("score_matching", "contrastive_divergence", "equilibrium_matching"):
        with pytest.raises(NonFiniteError, match=r"parameter 'net.0.weight' holds 1 NaN or infinite value\(s\) of 16"):
            registry.get("loss", name)()(model_with("nan-parameter"), torch.randn(8, 2), generator=torch.Generator())


def test_a_loss_sees_a_parameter_that_went_non_finite_after_a_finite_check():
    """The parameters' sum is skipped while they are the tensors, unchanged, last found finite: an in-place update
    (an optimizer step, a ``no_grad`` write) or a replaced parameter is summed again."""
    from ebmcore.errors import NonFiniteError

    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    loss, data = registry.get("loss", "score_matching")(), torch.randn(8, 2)
    loss(energy, data)
    loss(energy, data)  # unchanged: not summed again, still fine
    with torch.no_grad():
        energy.net[0].weight[0, 0] = math.inf
    with pytest.raises(NonFiniteError, match=r"parameter 'net.0.weight' holds 1 NaN or infinite"):
        loss(energy, data)
    energy.net[0].weight = torch.nn.Parameter(torch.randn(8, 2))
    loss(energy, data)
    energy.net[2].bias = torch.nn.Parameter(torch.full((1,), math.nan))
    with pytest.raises(NonFiniteError, match=r"parameter 'net.2.bias'"):
        loss(energy, data)


def test_a_trainer_whose_parameters_diverge_still_rolls_back():
    """The loss's refusal of non-finite parameters is, inside the Trainer, the non-finite loss its watchdog rolls back
    from (as before the loss checked them); a model that starts non-finite is refused at once."""
    from ebm_losses.training import Trainer
    from ebmcore.errors import NonFiniteError

    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    trainer = Trainer(energy, registry.get("loss", "score_matching")(), torch.randn(16, 2), batch_size=8)
    trainer.fit(2)
    with torch.no_grad():
        energy.net[0].weight[0, 0] = math.nan  # what a diverged optimizer step leaves
    trainer.fit(1)
    assert trainer.watchdog_report()["rollbacks"] == 1 and all(finite(p) for p in energy.parameters())
    start = Trainer(model_with("nan-parameter"), registry.get("loss", "score_matching")(), torch.randn(16, 2), batch_size=8)
    with pytest.raises(NonFiniteError, match=r"the state training starts from \(step 0\) fails the watchdog's check"):
        start.fit(1)
    start = Trainer(start.energy, start.loss, torch.randn(16, 2), batch_size=8, watchdog=False)
    with pytest.raises(NonFiniteError, match=r"parameter 'net.0.weight' holds"):
        start.fit(1)


def test_bind_names_a_mixed_dtype_or_misplaced_model():
    from ebmcore.errors import InputError

    with pytest.raises(InputError, match=r"layer 'b' \(Linear\) holds parameter 'b.weight' in torch.float64"):
        model_with("opaque-mixed-dtype").bind(torch.randn(3, 2))
    with pytest.raises(InputError, match=r"holds its parameters on meta but the states are on cpu; move one"):
        model_with("meta").bind(torch.randn(3, 2))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: ebmcore.energy("conv", seed=False), r"ConvEnergy: seed must be an integer .* got False"),
        (lambda: ebmcore.energy("conv", seed=np.float64(1)), r"ConvEnergy: seed must be an integer"),
        (lambda: ebmcore.energy("conv", dtype=torch.tensor(0.1)), r"ConvEnergy: dtype must be a floating torch.dtype"),
        (lambda: ebmcore.energy("noise_conditional_mlp", sigma_min=None), r"sigma_min must be a finite number, got None"),
        (lambda: ebmcore.energy("noise_conditional_mlp", seed="1"), r"NoiseConditionalEnergy: seed must be an integer"),
        (lambda: _descend(momentum=None), r"momentum must be a finite number >= 0, got None"),
        (lambda: _descend(step_size="1"), r"step_size must be a finite number >= 0, got '1'"),
        (lambda: _descend(momentum=1.0), r"momentum in \[0, 1\), got step_size=0.01, momentum=1.0"),
        (lambda: _descend(n_steps=True), r"n_steps must be an integer >= 1, got True"),
        (lambda: _trainer(data=torch.tensor(1.0)), r"data must have shape \(n, 2\) for Trainer, got \(\)"),
        (lambda: _trainer(data=torch.zeros(0, 2)), r"data is empty \(no rows, shape \(0, 2\)\); give at least"),
        (lambda: _trainer().fit(True), r"n_steps must be an integer >= 0, got True"),
    ],
)
def test_each_case_the_sweep_found_is_an_ebm_error_naming_the_problem(call, message):
    with pytest.raises(EBMError, match=message):
        call()


def _descend(**kwargs):
    from ebm_losses.equilibrium_matching import descend

    return descend(ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0), torch.randn(3, 2), **{"n_steps": 2, **kwargs})


def _trainer(data=None):
    from ebm_losses.training import Trainer

    data = torch.randn(16, 2) if data is None else data
    return Trainer(ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0), registry.get("loss", "score_matching")(), data, batch_size=8)


@pytest.mark.parametrize("case", ["nan", "inf", "constant"])
def test_an_array_file_of_non_finite_or_constant_values_is_refused_naming_the_fix(tmp_path, case):
    from ebm_losses import images

    np.savez(tmp_path / "a.npz", images=NPZ_CASES[case]())
    message = r"1 NaN or infinite value\(s\) of 32; .*numpy.nan_to_num" if case != "constant" else r"every value is 7.0"
    with pytest.raises(EBMError, match=message):
        images.load_array(tmp_path / "a.npz")
