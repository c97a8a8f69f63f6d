"""Property-based checks of the input checks: energies, samplers, losses and job configurations given random
shapes, dtypes, devices (cpu, meta), NaN/inf, zero, negative and non-numeric parameters and unknown keys.

Every case ends in a correct result or in an ``ebmcore`` error (``ebmcore.errors``) with a message, never in a
traceback from deep inside torch and never in a silently wrong result. The ``ci`` profile (``conftest.py``, the
default) is derandomised and bounded, so a run is reproducible and takes a few seconds per property; look further
with ``pytest tests/test_input_properties.py --hypothesis-profile=explore`` (random, 2000 examples each).
"""

import math
import warnings

import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

import ebmcore
from ebmcore.errors import EBMError
from ebmcore.recording import NonFiniteChainsWarning

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.complex64]
ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.0, -1.0, 1e-300, 1e300]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.lists(st.integers(-1, 2), max_size=3),
)


@st.composite
def tensors(draw, event=(2,), dtype=torch.float32):
    """A tensor ``(n, *event)`` of ``dtype`` on the CPU with at most one thing odd: its shape (no batch dimension, a
    wrong or extra event dimension), its dtype, its device (meta), a NaN or an infinity, an empty batch, huge values."""
    fault = draw(st.sampled_from(["none", "shape", "dtype", "meta", "non-finite", "empty", "huge"]))
    shape = (draw(st.integers(1, 5)), *event)
    if fault == "shape":
        shape = draw(st.sampled_from([shape[1:], shape[:1], (*shape, 1), (shape[0], *[e + 1 for e in event]), ()]))
    elif fault == "empty":
        shape = (0, *event)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
    if fault == "huge":
        x = x * 1e30
    if fault == "non-finite" and x.numel():
        x.view(-1)[draw(st.integers(0, x.numel() - 1))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    x = x.to(draw(st.sampled_from([t for t in DTYPES if t != dtype])) if fault == "dtype" else dtype)
    return x.to("meta") if fault == "meta" else x


def _ebm_or(call):
    """``call()``'s result, or the ``EBMError`` it raised (which must say something); anything else propagates."""
    try:
        result = call()
    except EBMError as err:
        event(f"{type(err).__name__}: {str(err).split(': ', 1)[-1][:40]}")
        assert len(str(err)) > 20, f"{type(err).__name__} with a bare message: {err!r}"
        return err
    event(f"result: {type(result).__name__}")
    return result


ENERGIES = {
    "double_well": lambda: ebmcore.energy("double_well", dim=2),
    "rosenbrock": lambda: ebmcore.energy("rosenbrock", dim=3),
    "gaussian": lambda: ebmcore.energy("gaussian", dim=2),
    "mlp": lambda: ebmcore.energy("mlp", dim=2, hidden=[4]),
    "gaussian_mixture": lambda: ebmcore.energy("gaussian_mixture", means=[[0.0, 1.0], [2.0, 0.0]], stds=0.5),
}


@given(
    name=st.sampled_from(sorted(ENERGIES) + ["harmonic", "ackley"]),
    params=st.dictionaries(
        st.sampled_from(["dim", "mean", "covariance", "stds", "means", "hidden", "seed", "barrier", "dtype", "unknown"]),
        ODD_VALUES,
        max_size=3,
    ),
)
def test_energies_are_built_or_refused_with_an_ebm_error(name, params):
    energy = _ebm_or(lambda: ebmcore.energy(name, **params))
    assert isinstance(energy, (ebmcore.EnergyModel, EBMError))


@given(name=st.sampled_from(sorted(ENERGIES)), data=st.data(), method=st.sampled_from(["energy", "gradient"]))
def test_energies_give_a_finite_result_of_the_right_shape_or_an_ebm_error(name, data, method):
    energy = ENERGIES[name]()
    x = data.draw(tensors(event=energy.event_shape), label="x")
    out = _ebm_or(lambda: getattr(energy, method)(x))
    if isinstance(out, EBMError):
        return
    assert out.shape == ((x.shape[0],) if method == "energy" else x.shape) and out.dtype == x.dtype and out.device == x.device
    assert bool(torch.isfinite(out).all())  # the checked methods never hand back NaN or inf


SAMPLER_NAMES = ["langevin", "mala", "hmc", "nuts", "chees", "meads", "parallel_tempering", "annealed_langevin"]
SAMPLER_PARAMS = st.dictionaries(
    st.sampled_from(
        [
            "step_size",
            "temperature",
            "n_leapfrog_steps",
            "max_tree_depth",
            "max_leapfrog_steps",
            "jitter",
            "damping",
            "n_replicas",
            "sigmas",
            "n_steps_each",
            "integrator",
            "inv_mass",
            "fused",
            "autocast",
            "base",
            "temperatures",
            "unknown",
        ]
    ),
    st.one_of(
        ODD_VALUES,
        st.sampled_from([0.1, 0.5, 2, "leapfrog", "mala"]),
        st.builds(lambda v, n: torch.full((n,), v), st.floats(-1, 1), st.integers(0, 3)),
    ),
    max_size=2,
)


@given(name=st.sampled_from(SAMPLER_NAMES), params=SAMPLER_PARAMS)
def test_samplers_are_built_or_refused_with_an_ebm_error(name, params):
    sampler = _ebm_or(lambda: ebmcore.registry.get("sampler", name)(ebmcore.energy("gaussian", dim=2), **params))
    assert isinstance(sampler, (ebmcore.Sampler, EBMError))


SAMPLERS = {
    "langevin": dict(step_size=0.1),
    "langevin-per-step": dict(step_size=0.1, fused=False),
    "mala": dict(step_size=0.5),
    "hmc": dict(step_size=0.3, n_leapfrog_steps=2),
    "nuts": dict(step_size=0.3, max_tree_depth=3),
    "chees": dict(step_size=0.3, max_leapfrog_steps=4),
    "meads": dict(step_size=0.3, damping=0.5),
    "parallel_tempering": dict(n_replicas=2),
    "annealed_langevin": dict(sigmas=[1.0, 0.1], n_steps_each=2),
}


@given(
    name=st.sampled_from(sorted(SAMPLERS)),
    fault=st.sampled_from(["none", "x0", "x0", "n_steps", "thin", "tunable"]),
    data=st.data(),
    record=st.booleans(),
)
def test_samplers_give_states_shaped_like_x0_or_an_ebm_error(name, fault, data, record):
    """One thing at a time is odd (``fault``), so that every check is reached, and sampling itself."""
    sampler = ebmcore.registry.get("sampler", name.removesuffix("-per-step"))(ebmcore.energy("gaussian", dim=2), **SAMPLERS[name])
    x0, n_steps, thin, tunables = torch.randn(3, 2), 3, 1, {}
    if fault == "x0":
        x0 = data.draw(tensors(), label="x0")
    elif fault == "n_steps":
        n_steps = data.draw(st.one_of(st.integers(-1, 4), ODD_VALUES))
    elif fault == "thin":
        thin = data.draw(st.one_of(st.integers(-1, 4), ODD_VALUES))
    elif fault == "tunable":
        tunables = data.draw(
            st.dictionaries(st.sampled_from(["step_size", "temperature", "unknown"]), ODD_VALUES, min_size=1, max_size=1)
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _ebm_or(
            lambda: sampler.sample(
                x0,
                n_steps,
                thin=thin,
                return_trajectory=record,
                return_diagnostics=record,
                generator=torch.Generator().manual_seed(0),
                **tunables,
            )
        )
    if isinstance(out, EBMError):
        return
    samples = out.samples if record else out
    assert samples.shape == x0.shape and samples.dtype == x0.dtype
    if not bool(torch.isfinite(samples).all()):  # ULA at too large a step: said, not silent
        assert any(issubclass(w.category, NonFiniteChainsWarning) for w in caught)
    if record:
        assert out.trajectory.shape == (n_steps // thin, *x0.shape)


LOSS_OPTIONS = st.dictionaries(
    st.sampled_from(
        [
            "n_steps",
            "regularization",
            "gradient_clip",
            "sampler",
            "buffer_size",
            "reinit_fraction",
            "noise",
            "method",
            "n_probes",
            "probe",
            "n_projections",
            "projection",
            "sigma",
            "sigmas",
            "noise_ratio",
            "noise_scale",
            "unknown",
        ]
    ),
    st.one_of(ODD_VALUES, st.sampled_from([1, 5, 0.1, "langevin", "gaussian", "rademacher"])),
    max_size=2,
)


@given(
    name=st.sampled_from(
        [
            "contrastive_divergence",
            "persistent_contrastive_divergence",
            "score_matching",
            "sliced_score_matching",
            "denoising_score_matching",
            "nce",
        ]
    ),
    fault=st.sampled_from(["none", "options", "data", "data"]),
    data=st.data(),
)
def test_losses_give_a_finite_differentiable_scalar_or_an_ebm_error(name, fault, data):
    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    options = data.draw(LOSS_OPTIONS, label="options") if fault == "options" else {}
    batch = data.draw(tensors(), label="batch") if fault == "data" else torch.randn(8, 2)
    loss = _ebm_or(lambda: ebmcore.registry.get("loss", name)(**options))
    if isinstance(loss, EBMError):
        return
    value = _ebm_or(lambda: loss(energy, batch, generator=torch.Generator().manual_seed(0)))
    if isinstance(value, EBMError):
        return
    assert value.shape == () and bool(torch.isfinite(value)) and value.requires_grad


def _toml(value):
    """A TOML value (inline tables for dicts)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value == math.inf else "-inf" if value == -math.inf else repr(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"


TOML_VALUES = st.one_of(
    st.booleans(),
    st.integers(-2, 3),
    st.sampled_from([0.0, 0.5, -1.0, math.nan, math.inf, 1e9]),
    st.sampled_from(
        ["", "mala", "nuts", "gaussian", "mlp", "nce", "cpu", "meta", "cuda:3", "x", "double_well", "torch", "eight_gaussians"]
    ),
    st.lists(st.integers(0, 2), max_size=2),
    st.dictionaries(
        st.sampled_from(["dim", "step_size", "n_steps", "x", "hidden"]),
        st.one_of(st.integers(-1, 3), st.sampled_from([0.5, "a"])),
        max_size=2,
    ),
)


@st.composite
def job_tables(draw, default, schema):
    """The bundled configuration with one thing changed: a known key set to any value, an unknown key or table."""
    tables = {table: dict(body) for table, body in default.items()}
    fault = draw(st.sampled_from(["value", "value", "value", "unknown key", "unknown table", "none"]))
    table = draw(st.sampled_from(sorted(schema)))
    if fault == "value":
        tables.setdefault(table, {})[draw(st.sampled_from(sorted(schema[table])))] = draw(TOML_VALUES)
    elif fault == "unknown key":
        tables.setdefault(table, {})["n_chain"] = 3
    elif fault == "unknown table":
        tables["samplers"] = {"name": "mala"}
    return tables


def _write(tmp_path, tables):
    path = tmp_path / "job.toml"
    path.write_text(
        "".join(f"[{table}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in body.items()) for table, body in tables.items())
    )
    return path


def _bundled(job):
    module = __import__(f"{job}.{'sample_job' if job == 'ebm_samplers' else 'train_job'}", fromlist=["SCHEMA"])
    import tomllib

    return module, tomllib.loads(module.default_config_path().read_text()), module.SCHEMA


SAMPLE_JOB, SAMPLE_DEFAULT, SAMPLE_SCHEMA = _bundled("ebm_samplers")
TRAIN_JOB, TRAIN_DEFAULT, TRAIN_SCHEMA = _bundled("ebm_losses")


@given(tables=job_tables(SAMPLE_DEFAULT, SAMPLE_SCHEMA))
def test_sample_job_configurations_load_and_build_or_give_an_ebm_error(tmp_path, tables):
    config = _ebm_or(lambda: SAMPLE_JOB.load_config(_write(tmp_path, tables)))
    if isinstance(config, EBMError):
        return
    built = _ebm_or(lambda: SAMPLE_JOB.build(config, torch.device("cpu")))
    if not isinstance(built, EBMError):
        energy, sampler = built
        assert isinstance(energy, ebmcore.EnergyModel) and isinstance(sampler, ebmcore.Sampler)


@given(tables=job_tables(TRAIN_DEFAULT, TRAIN_SCHEMA))
def test_train_job_configurations_load_or_give_an_ebm_error(tmp_path, tables):
    _ebm_or(lambda: TRAIN_JOB.load_config(_write(tmp_path, tables)))


def _sample(name, x0=None, n_steps=2, **params):
    energy = ebmcore.energy("gaussian", dim=2)
    x0 = torch.randn(4, 2) if x0 is None else x0
    return lambda: ebmcore.registry.get("sampler", name)(energy, **params).sample(x0, n_steps)


def _loss(name, data=None, **options):
    data = torch.randn(8, 2) if data is None else data
    return lambda: ebmcore.registry.get("loss", name)(**options)(ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0), data)


@pytest.mark.parametrize(
    "call, message",
    [
        # what these properties found (each was a TypeError or RuntimeError from inside, or a NaN), pinned
        (
            lambda: ebmcore.energy("gaussian_mixture", dim=2),
            r"energy 'gaussian_mixture' \(GaussianMixtureEnergy\): missing a required argument: 'means'; it takes means, stds",
        ),
        (lambda: ebmcore.energy("gaussian", dim=[]), r"GaussianEnergy: dim must be a positive integer, got \[\]"),
        (lambda: ebmcore.energy("gaussian_mixture", means=None), r"means must be numbers"),
        (lambda: ebmcore.energy("mlp", dtype=False), r"MLPEnergy: dtype must be a floating torch.dtype"),
        (lambda: ebmcore.energy("mlp", seed=False), r"MLPEnergy: seed must be an integer"),
        (lambda: ebmcore.energy("mlp", hidden=None), r"MLPEnergy: hidden must be positive integers"),
        (
            lambda: ebmcore.energy("double_well", dim=2).energy(torch.zeros(2, 2, device="meta")),
            r"meta device, which holds shapes",
        ),
        (_sample("mala", x0=torch.zeros(2, 2, device="meta")), r"x0 is on the meta device"),
        (_sample("nuts", x0=torch.zeros(0, 2)), r"x0 has no chains \(shape \(0, 2\)\)"),
        (_sample("langevin", step_size=1e300), r"step_size must lie in \[1.18e-38, 3.4e\+38\] for torch.float32 states"),
        (_sample("annealed_langevin", step_size=1e300), r"step_size must lie in"),
        (_sample("langevin", fused=torch.tensor([])), r"fused must be None \(automatic\), True or False"),
        (_sample("parallel_tempering", n_replicas=None), r"n_replicas must be an integer >= 2, got None"),
        (_sample("parallel_tempering", temperatures=False), r"temperatures must be a list of numbers"),
        (_sample("annealed_langevin", sigmas=False), r"sigmas must be a list of positive, non-increasing numbers"),
        (_loss("score_matching", data=torch.zeros(0, 2)), r"ScoreMatching needs a batch of at least 1 row"),
        (_loss("nce", data=torch.zeros(1, 2)), r"NoiseContrastiveEstimation needs a batch of at least 2 row"),
        (_loss("sliced_score_matching", data=torch.tensor([[math.nan, 0.0], [0.0, 0.0]])), r"data is non-finite .* rows \[0\]"),
        (
            _loss("persistent_contrastive_divergence", method=None),
            r"got an unexpected keyword argument 'method'; it takes sampler, n_steps",
        ),
        (_loss("denoising_score_matching", sigmas=False), r"give sigma, or a non-empty list sigmas"),
        (_loss("nce", noise_scale=""), r"noise_scale must be a positive number"),
    ],
)
def test_each_case_the_properties_found_is_an_ebm_error_naming_the_problem(call, message):
    with pytest.raises(EBMError, match=message):
        call()


def test_a_gradient_clip_beyond_the_dtype_clips_nothing():
    energy, data = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0), torch.randn(8, 2)
    values = [
        ebmcore.registry.get("loss", "contrastive_divergence")(gradient_clip=clip, sampler_options={"fused": False})(
            energy, data, generator=torch.Generator().manual_seed(0)
        )
        for clip in (None, 1e300)
    ]  # one noise stream for both
    assert torch.equal(values[0], values[1])


def test_a_denoising_sigma_beyond_the_datas_dtype_is_refused():
    for sigma in (1e300, 1e-300, 1e-20):
        with pytest.raises(EBMError, match=r"sigma must lie in \[5.42e-17, 1.84e\+16\] for torch.float32 data"):
            _loss("denoising_score_matching", sigma=sigma)()
    assert bool(torch.isfinite(_loss("denoising_score_matching", sigma=1e-6)()))  # small, not absurd: a finite loss


@given(
    dtype=st.sampled_from(DTYPES),
    shape=st.sampled_from([(0,), (7,), (3, 5), (2, 1, 4)]),
    seed=st.integers(0, 99),
    scale=st.sampled_from([1.0, 1e30, 1e300]),
    odd=st.lists(st.sampled_from([math.nan, math.inf, -math.inf]), max_size=2),
)
def test_all_finite_agrees_with_the_elementwise_test(dtype, shape, seed, scale, odd):
    """The sum shortcut of ``ebmcore.validation.all_finite`` answers as ``isfinite(x).all()`` does, including where
    large finite values overflow the sum (then the element-wise test decides), for every dtype."""
    from ebmcore.validation import all_finite

    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale
    for k, value in enumerate(odd):
        if x.numel():
            x.view(-1)[(seed + 3 * k) % x.numel()] = value
    x = x.to(dtype)
    assert all_finite(x) == bool(torch.isfinite(x).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_all_finite_when_finite_values_overflow_their_sum(dtype):
    """Finite values whose sum overflows (to inf, or to NaN with both signs) are finite: the element-wise test decides."""
    from ebmcore.validation import all_finite

    big = torch.finfo(dtype).max
    assert all_finite(torch.full((4,), big, dtype=dtype)) and all_finite(torch.tensor([big, big, -big, -big], dtype=dtype))
    assert not all_finite(torch.tensor([big, big, math.nan], dtype=dtype))
