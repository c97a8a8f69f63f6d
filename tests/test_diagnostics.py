"""MCMC diagnostics: ArviZ's numbers on stored recipes, statistical properties, shapes, dtypes and input errors.

The reference numbers in ``tests/data/diagnostics_reference.json`` were computed with ArviZ (its
version is recorded there) from inputs that each case's recipe regenerates here from a seed with
numpy's legacy ``RandomState``; ArviZ itself is not needed to run these tests.
"""

import functools
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ebmcore import diagnostics as diag
from ebmcore.errors import InputError

REFERENCE = json.loads((Path(__file__).parent / "data" / "diagnostics_reference.json").read_text())
RTOL = 1e-6  # observed: ~1e-15 (float64 rounding only)


def _recipe(case: dict) -> torch.Tensor:
    """Regenerate a case's input from its stored recipe, and check it is the array ArviZ saw."""
    namespace = {"np": np, "rng": np.random.RandomState(case["seed"])}
    exec(case["recipe"], namespace)  # our own data file: numpy code that leaves `x`
    x = np.asarray(namespace["x"], dtype=np.float64)
    fp = case["fingerprint"]
    assert list(x.shape) == fp["shape"]
    np.testing.assert_allclose(
        [x.sum(), (x**2).sum(), *x.ravel()[:3], x.ravel()[-1]],
        [fp["sum"], fp["sum_sq"], *fp["first"], fp["last"]],
        rtol=1e-12,
        atol=1e-12,
    )
    return torch.as_tensor(x)


def _close(ours: torch.Tensor, reference, rtol: float = RTOL, atol: float = 0.0) -> None:
    got = ours.detach().cpu().double().numpy().ravel()
    want = np.array([np.nan if v is None else v for v in np.ravel(np.asarray(reference, dtype=object))], dtype=float)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)


CASES = REFERENCE["cases"]


def test_reference_file_records_arviz():
    assert REFERENCE["versions"]["arviz"]
    assert len(CASES) >= 8 and len(REFERENCE["energies"]) >= 3


@pytest.mark.parametrize("name", sorted(CASES))
def test_rhat_matches_arviz(name):
    x, ref = _recipe(CASES[name]), CASES[name]["reference"]
    _close(diag.split_rhat(x), ref["rhat_rank"])
    _close(diag.split_rhat(x, rank_normalize=False), ref["rhat_split"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_ess_matches_arviz(name):
    x, ref = _recipe(CASES[name]), CASES[name]["reference"]
    _close(diag.ess_bulk(x), ref["ess_bulk"])
    _close(diag.ess_tail(x), ref["ess_tail"])
    _close(diag.ess_tail(x, prob=0.2), ref["ess_tail_prob_0.2"])
    _close(diag.ess_mean(x), ref["ess_mean"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_autocorrelation_and_summary_match_arviz(name):
    x, ref = _recipe(CASES[name]), CASES[name]["reference"]
    expected = np.asarray(ref["autocorr"])  # (lag, chain, element)
    got = diag.autocorrelation(x, max_lag=expected.shape[0] - 1)
    assert got.shape == (expected.shape[0], *x.shape[1:])
    _close(got, expected, atol=1e-12)
    table = diag.summary(x)
    for key in ("mean", "sd"):
        _close(table[key], ref["summary"][key], atol=1e-12)
    for key in ("ess_bulk", "ess_tail"):
        _close(table[key], ref["summary"][key])
    # summary's r_hat is split_rhat's; az.summary agrees except with an odd number of draws (see the JSON note)
    _close(table["r_hat"], ref["rhat_rank"])
    if x.shape[0] % 2 == 0:
        _close(table["r_hat"], ref["summary"]["r_hat"])


@pytest.mark.parametrize("name", sorted(REFERENCE["energies"]))
def test_ebfmi_matches_arviz(name):
    case = REFERENCE["energies"][name]
    _close(diag.ebfmi(_recipe(case)), case["reference"]["bfmi"])


def test_float32_input_gives_float32_results_close_to_float64():
    case = CASES["event_2x3"]
    x = _recipe(case).float()
    for fn, key in [(diag.split_rhat, "rhat_rank"), (diag.ess_bulk, "ess_bulk"), (diag.ess_mean, "ess_mean")]:
        out = fn(x)
        assert (out.shape, out.dtype) == ((2, 3), torch.float32)
        _close(out, case["reference"][key], rtol=1e-4)


# --- properties of the diagnostics themselves ---------------------------------------------------


def _ar1(rho: float, shape: tuple, seed: int) -> torch.Tensor:
    """Stationary AR(1) chains ``x_t = ρ x_{t−1} + ε_t`` of shape ``(n_draws, n_chains, ...)``."""
    e = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    x = torch.empty_like(e)
    x[0] = e[0] / math.sqrt(1 - rho**2)
    for t in range(1, shape[0]):
        x[t] = rho * x[t - 1] + e[t]
    return x


@functools.lru_cache(maxsize=1)
def _ar1_09() -> torch.Tensor:
    return _ar1(0.9, (2000, 4, 30), seed=3)


def test_rhat_near_one_for_iid_chains_and_large_for_chains_stuck_in_different_modes():
    g = torch.Generator().manual_seed(0)
    iid = torch.randn(1000, 4, 20, generator=g, dtype=torch.float64)
    for rank_normalize in (True, False):
        assert (diag.split_rhat(iid, rank_normalize=rank_normalize) - 1).abs().max() < 0.01
    modes = torch.randn(500, 4, 3, generator=g, dtype=torch.float64) + torch.tensor([-3.0, -3.0, 3.0, 3.0])[:, None]
    assert (diag.split_rhat(modes) > 1.1).all()
    assert (diag.split_rhat(modes, rank_normalize=False) > 1.1).all()


def test_tail_rhat_catches_chains_that_differ_only_in_scale():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1000, 4, generator=g, dtype=torch.float64) * torch.tensor([1.0, 1.0, 1.0, 4.0])
    assert diag.split_rhat(x) > 1.01  # same means: only the folded (tail) R-hat sees it
    assert diag.split_rhat(x, rank_normalize=False) < 1.01


def test_ess_of_iid_draws_is_about_the_number_of_draws():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(500, 4, 40, generator=g, dtype=torch.float64)
    for fn in (diag.ess_bulk, diag.ess_mean, diag.ess_tail):
        assert abs(fn(x).mean().item() / 2000 - 1) < 0.05, fn.__name__


def test_ess_of_ar1_is_about_its_theoretical_value():
    rho, x = 0.9, _ar1_09()
    expected = (1 - rho) / (1 + rho) * 8000  # ≈ 421 of 8000 draws
    for fn in (diag.ess_bulk, diag.ess_mean):
        assert abs(fn(x).mean().item() / expected - 1) < 0.08, fn.__name__


def test_autocorrelation_of_ar1_is_rho_to_the_lag():
    rho, x = 0.9, _ar1_09()
    acf = diag.autocorrelation(x, max_lag=10)
    assert acf.shape == (11, 4, 30)
    assert torch.equal(acf[0], torch.ones_like(acf[0]))
    torch.testing.assert_close(acf.mean((1, 2)), rho ** torch.arange(11, dtype=torch.float64), atol=0.03, rtol=0)


def test_ebfmi_is_low_for_a_random_walk_energy_and_about_two_for_independent_energies():
    g = torch.Generator().manual_seed(5)
    e = torch.randn(2000, 4, generator=g, dtype=torch.float64)
    assert (diag.ebfmi(e.cumsum(0)) < 0.3).all()
    torch.testing.assert_close(diag.ebfmi(e), torch.full((4,), 2.0, dtype=torch.float64), atol=0.15, rtol=0)


def test_rank_diagnostics_ignore_monotone_and_affine_transforms():
    x = _ar1(0.5, (400, 4, 3), seed=6)
    y = torch.exp(3 * x)  # heavy right tail, same ranks and quantiles
    torch.testing.assert_close(diag.ess_bulk(y), diag.ess_bulk(x))
    torch.testing.assert_close(diag.ess_tail(y), diag.ess_tail(x))
    # the tail R-hat folds around the median, which only affine maps preserve
    for rank_normalize in (True, False):
        torch.testing.assert_close(diag.split_rhat(2 * x + 5, rank_normalize), diag.split_rhat(x, rank_normalize))


def test_one_chain_is_split_into_two_and_odd_draws_drop_the_middle_one():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(201, 1, 2, generator=g, dtype=torch.float64)
    assert torch.isfinite(diag.split_rhat(x)).all()
    assert torch.isfinite(diag.ess_bulk(x)).all()
    # the middle draw of an odd chain takes no part in split R-hat
    moved = x.clone()
    moved[100] = 1e6
    torch.testing.assert_close(diag.split_rhat(moved, rank_normalize=False), diag.split_rhat(x, rank_normalize=False))


def test_constant_elements():
    x = torch.randn(50, 3, 2, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    x[:, :, 0] = 0.5
    assert diag.ess_bulk(x)[0] == diag.ess_mean(x)[0] == diag.ess_tail(x)[0] == 150  # ArviZ: the draw count
    assert torch.isnan(diag.split_rhat(x)[0]) and torch.isfinite(diag.split_rhat(x)[1])
    acf = diag.autocorrelation(x, max_lag=3)
    assert torch.isnan(acf[:, :, 0]).all() and torch.isfinite(acf[:, :, 1]).all()


def test_summary_is_the_individual_functions():
    x = torch.randn(101, 3, 2, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    table = diag.summary(x)
    assert set(table) == {"mean", "sd", "ess_bulk", "ess_tail", "r_hat"}
    torch.testing.assert_close(table["mean"], x.mean((0, 1)))
    torch.testing.assert_close(table["sd"], x.reshape(-1, 2).std(0))
    torch.testing.assert_close(table["ess_bulk"], diag.ess_bulk(x))
    torch.testing.assert_close(table["ess_tail"], diag.ess_tail(x))
    torch.testing.assert_close(table["r_hat"], diag.split_rhat(x))


def test_acceptance_rate_and_divergences():
    accepted = torch.tensor([[True, False], [True, False], [False, False], [True, True]])
    torch.testing.assert_close(diag.acceptance_rate(accepted), torch.tensor([0.75, 0.25]))
    probs = torch.tensor([[0.5, 1.0], [0.25, 0.0]], dtype=torch.float64)
    rate = diag.acceptance_rate(probs)
    assert rate.dtype == torch.float64 and rate.tolist() == [0.375, 0.5]
    counts = diag.divergences(accepted)
    assert counts.dtype == torch.int64 and counts.tolist() == [3, 1]
    assert diag.divergences(torch.tensor([[0, 1], [1, 1]])).tolist() == [1, 2]


# --- shapes, dtypes, devices --------------------------------------------------------------------


def _devices():
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices.append("cuda")
    return devices


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_shapes_dtypes_and_devices(dtype, device):
    x = torch.randn(60, 3, 2, 4, generator=torch.Generator().manual_seed(10)).to(dtype=dtype, device=device)
    out_dtype = torch.float64 if dtype == torch.float64 else torch.float32  # half precision comes back as float32
    for value in [
        diag.split_rhat(x),
        diag.split_rhat(x, rank_normalize=False),
        diag.ess_bulk(x),
        diag.ess_tail(x),
        diag.ess_mean(x),
        *diag.summary(x).values(),
    ]:
        assert (value.shape, value.dtype, value.device.type) == ((2, 4), out_dtype, device)
    acf = diag.autocorrelation(x, max_lag=5)
    assert (acf.shape, acf.dtype, acf.device.type) == ((6, 3, 2, 4), out_dtype, device)
    bfmi = diag.ebfmi(x[:, :, 0, 0])
    assert (bfmi.shape, bfmi.dtype, bfmi.device.type) == ((3,), out_dtype, device)
    accepted = torch.ones(60, 3, dtype=torch.bool, device=device)
    assert diag.acceptance_rate(accepted).device.type == device
    assert diag.divergences(accepted).device.type == device


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    x = _recipe(CASES["event_2x3"])
    for fn in (diag.split_rhat, diag.ess_bulk, diag.ess_tail, diag.ess_mean):
        torch.testing.assert_close(fn(x.cuda()).cpu(), fn(x), rtol=1e-9, atol=0)


def test_scalar_and_empty_event_shapes():
    x = torch.randn(20, 2, generator=torch.Generator().manual_seed(11))
    assert diag.split_rhat(x).shape == () and diag.ess_bulk(x).shape == ()
    assert diag.autocorrelation(x).shape == (20, 2)
    empty = torch.randn(20, 2, 0)
    assert diag.ess_tail(empty).shape == (0,) and diag.split_rhat(empty).shape == (0,)
    assert diag.autocorrelation(empty, max_lag=3).shape == (4, 2, 0)
    assert all(v.shape == (0,) for v in diag.summary(empty).values())


# --- input errors -------------------------------------------------------------------------------

DRAW_FUNCTIONS = [diag.split_rhat, diag.ess_bulk, diag.ess_tail, diag.ess_mean, diag.autocorrelation, diag.summary]


@pytest.mark.parametrize("fn", DRAW_FUNCTIONS + [diag.ebfmi], ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    "bad, message",
    [
        (np.zeros((10, 2)), "must be a torch.Tensor"),
        (torch.zeros(10, 2, dtype=torch.int64), "floating-point"),
        (torch.zeros(10, 2, dtype=torch.complex64), "floating-point"),
        (torch.zeros(10), "unsqueeze(1)"),
        (torch.zeros(3, 2), "at least 4 are needed"),
        (torch.zeros(10, 0), "no chains"),
        (torch.zeros(10, 2).index_put_((torch.tensor(4), torch.tensor(1)), torch.tensor(float("nan"))), "[4, 1]"),
        (torch.zeros(10, 2).index_put_((torch.tensor(0), torch.tensor(0)), torch.tensor(float("inf"))), "non-finite"),
    ],
    ids=["numpy", "int", "complex", "1-d", "3-draws", "0-chains", "nan", "inf"],
)
def test_bad_draws_raise_input_error(fn, bad, message):
    with pytest.raises(InputError) as err:
        fn(bad)
    assert message in str(err.value)
    assert fn.__name__ in str(err.value)


def test_transposed_layout_gets_a_hint():
    with pytest.raises(InputError, match=r"transpose\(0, 1\)"):
        diag.split_rhat(torch.randn(2, 500))


def test_other_bad_arguments():
    x = torch.randn(10, 2)
    for max_lag in (-1, 10, 2.5, True):
        with pytest.raises(InputError, match="max_lag"):
            diag.autocorrelation(x, max_lag=max_lag)
    for prob in (0.0, 1.0, -0.1, "a"):
        with pytest.raises(InputError, match="prob"):
            diag.ess_tail(x, prob=prob)
    with pytest.raises(InputError, match=r"\(n_draws, n_chains\)"):
        diag.ebfmi(torch.randn(10, 2, 3))


@pytest.mark.parametrize("fn", [diag.acceptance_rate, diag.divergences], ids=lambda f: f.__name__)
def test_bad_per_step_flags_raise_input_error(fn):
    with pytest.raises(InputError, match="must be a torch.Tensor"):
        fn([[True, False]])
    with pytest.raises(InputError, match="unsqueeze"):
        fn(torch.ones(5, dtype=torch.bool))
    with pytest.raises(InputError, match="at least 1 draw"):
        fn(torch.ones(0, 3, dtype=torch.bool))
    with pytest.raises(InputError, match="complex"):
        fn(torch.ones(5, 2, dtype=torch.complex64))
    with pytest.raises(InputError, match="NaN"):
        fn(torch.tensor([[0.5, float("nan")]]))
    with pytest.raises(InputError, match="0 or 1" if fn is diag.divergences else r"values in \[0, 1\]"):
        fn(torch.tensor([[0.5, 2.0]]))


CHUNKED = {
    "split_rhat": diag.split_rhat,
    "split_rhat(rank_normalize=False)": lambda x: diag.split_rhat(x, rank_normalize=False),
    "ess_bulk": diag.ess_bulk,
    "ess_tail": diag.ess_tail,
    "ess_mean": diag.ess_mean,
    **{f"summary[{key}]": (lambda x, key=key: diag.summary(x)[key]) for key in ("mean", "sd", "ess_bulk", "ess_tail", "r_hat")},
}


@pytest.mark.parametrize("chunk", [41 * 6, 41], ids=["element-blocks", "chunks-of-one-chain"])
def test_chunked_statistics_equal_the_unchunked_ones(monkeypatch, chunk):
    # random walks (chains that disagree), an odd number of draws, ties in one element, a (3, 2) event
    x = torch.randn(41, 6, 3, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64).cumsum(0)
    x[:, :, 0, 0] = x[:, :, 0, 0].round()
    monkeypatch.setattr(diag, "CHUNK_VALUES", 10**9)  # everything in one block
    whole = {name: fn(x) for name, fn in CHUNKED.items()}
    acf = diag.autocorrelation(x)
    monkeypatch.setattr(diag, "CHUNK_VALUES", chunk)  # one element per block, then chunks of chains within it
    for name, fn in CHUNKED.items():
        torch.testing.assert_close(fn(x), whole[name], rtol=1e-12, atol=0, msg=name)  # float64 rounding only
    torch.testing.assert_close(diag.autocorrelation(x), acf, rtol=0, atol=1e-12)


_MEMORY_SCRIPT = """
import resource, sys, torch
from ebmcore import diagnostics
torch.set_num_threads(1)
diagnostics.summary(torch.randn(400, 100, 2))  # first use: libraries, FFT plans
x = torch.randn(400, 100, 50)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux
diagnostics.summary(x)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before) / (x.numel() * x.element_size()))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in kilobytes on Linux only")
def test_summary_needs_less_memory_than_the_trajectory_it_diagnoses():
    # peak RSS growth of a fresh process; before the statistics ran in chunks it was 36x the trajectory
    out = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT], capture_output=True, text=True, check=True)
    assert float(out.stdout) < 1.5  # a float64 copy of the whole trajectory alone would be 2
