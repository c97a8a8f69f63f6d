"""The host (CPU) build of the kernels against the torch reference backend and ebm_cuda.reference."""

import pytest
import torch

from ebmcore.errors import InputError
from ebmcore.kernels import torch_backend as ref
from ebmcore.kernels.fused import hmc_chain_reference, langevin_chain_reference
from ebmcore.kernels.ops import sample_inputs
from ebmcore.testing import check_kernel
from ebm_cuda import ops, reference
from ebm_cuda.backends import HostBackend
from ebm_cuda.energies import LAYOUTS

BACKEND = HostBackend()
ENERGIES = list(ops.KINDS)  # the energies of csrc/ebm/energies.h: gaussian, double_well, rosenbrock, harmonic
PLAIN_OPS = ["langevin_step"] + [f"{e}_{k}" for e in ENERGIES for k in ("energy", "gradient")]


def _params(name, d, dtype=torch.float64):
    return sample_inputs(f"{name}_energy", 1, d, dtype=dtype)[1:]


def test_every_plain_op_matches_the_torch_reference():
    checked = check_kernel(BACKEND, PLAIN_OPS, dtypes=(torch.float32, torch.float64), n=37, d=5)
    assert len(checked) == 2 * len(PLAIN_OPS)


@pytest.mark.parametrize("name, d", [(e, d) for e in ENERGIES for d in (1, 2, 3, 10, 70) if d >= LAYOUTS[e].energy.min_dim])
def test_energies_and_gradients_for_any_dimension(name, d):
    x, *params = sample_inputs(f"{name}_energy", 19, d)
    for kind in ("energy", "gradient"):
        got = BACKEND.kernels[f"{name}_{kind}"].fn(x, *params)
        torch.testing.assert_close(got, getattr(ref, f"{name}_{kind}")(x, *params), rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ENERGIES)
def test_half_precision_states_compute_in_float32(name, dtype):
    x, *params = sample_inputs(f"{name}_energy", 64, 4)
    x16 = (0.5 * x).to(dtype)
    for kind in ("energy", "gradient"):
        got = BACKEND.kernels[f"{name}_{kind}"].fn(x16, *params)
        assert got.dtype == dtype
        expected = getattr(ref, f"{name}_{kind}")(x16.double(), *params)  # exact input, math in float64
        torch.testing.assert_close(
            got.double(), expected.to(dtype).double(), rtol=2**-7 if dtype == torch.bfloat16 else 2**-10, atol=1e-2
        )


def _chain_args(name, d):
    x, *params = sample_inputs(f"{name}_energy", 33, d)
    return (0.3 * x if name == "rosenbrock" else x), params


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ENERGIES)
def test_langevin_chain_matches_reference_steps_with_the_same_noise(name, dtype):
    x, params = _chain_args(name, 6)
    h = 1e-3 if name == "rosenbrock" else 0.02
    got = BACKEND.kernels[f"{name}_langevin_chain"].fn(
        x.to(dtype), *params, n_steps=8, step_size=h, noise_scale=0.3, seed=12345, offset=77
    )
    grad = getattr(ref, f"{name}_gradient")
    expected = langevin_chain_reference(
        lambda z: grad(z, *params), x, n_steps=8, step_size=h, noise_scale=0.3, seed=12345, offset=77, normal=reference.normal
    )
    tol = 1e-5 if dtype == torch.float32 else 1e-6  # float64 states take float32 noise: a few float32 ulps of it
    torch.testing.assert_close(got.double(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", ENERGIES)
def test_fused_chain_equals_k_single_steps(name):
    x, params = _chain_args(name, 5)
    chain = BACKEND.kernels[f"{name}_langevin_chain"].fn
    h = torch.linspace(1e-3, 2e-3, x.shape[0], dtype=torch.float64)  # per-chain step sizes too
    fused = chain(x, *params, n_steps=9, step_size=h, noise_scale=0.1, seed=5, offset=1000)
    stepped = x
    for t in range(9):
        stepped = chain(stepped, *params, n_steps=1, step_size=h, noise_scale=0.1, seed=5, offset=1000 + t)
    assert torch.equal(fused, stepped)


@pytest.mark.parametrize("name", ENERGIES)
def test_hmc_chain_matches_reference(name):
    x, params = _chain_args(name, 4)
    h = 0.01 if name == "rosenbrock" else 0.15
    got, accepted, divergent = BACKEND.kernels[f"{name}_hmc_chain"].fn(
        x, *params, n_steps=6, step_size=h, n_leapfrog_steps=5, inverse_temperature=0.8, seed=9, offset=3
    )
    e, g = getattr(ref, f"{name}_energy"), getattr(ref, f"{name}_gradient")
    exp_x, exp_acc, exp_div = hmc_chain_reference(
        lambda z: (e(z, *params), g(z, *params)),
        x,
        n_steps=6,
        step_size=h,
        n_leapfrog_steps=5,
        inverse_temperature=0.8,
        seed=9,
        offset=3,
        normal=reference.normal,
        uniform=reference.uniform,
    )
    torch.testing.assert_close(got, exp_x, rtol=1e-5, atol=1e-5)  # float32 noise, amplified along trajectories
    assert torch.equal(accepted, exp_acc) and torch.equal(divergent, exp_div)
    assert 0 < accepted.sum() < 6 * x.shape[0] or name != "double_well"  # some moves accepted


def test_hmc_chain_counts_divergences_and_rejects_them():
    x, params = _chain_args("double_well", 3)
    got, accepted, divergent = BACKEND.kernels["double_well_hmc_chain"].fn(
        x, *params, n_steps=4, step_size=50.0, n_leapfrog_steps=10, inverse_temperature=1.0, seed=1, offset=0
    )
    assert torch.equal(got, x) and accepted.sum() == 0 and divergent.sum() == 4 * x.shape[0]
    assert torch.isfinite(got).all()


def test_langevin_step_philox_adds_the_streams_noise():
    x, grad = torch.randn(40, 6, dtype=torch.float64), torch.randn(40, 6, dtype=torch.float64)
    got = BACKEND.kernels["langevin_step_philox"].fn(x, grad, 0.01, 0.2, seed=4, offset=8)
    expected = x - 0.01 * grad + 0.2 * reference.normal(40, 6, 4, 8).double()
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_chain_tracks_float32(dtype):
    x, params = _chain_args("harmonic", 8)
    chain = BACKEND.kernels["harmonic_langevin_chain"].fn
    start = x.to(dtype)
    full = chain(start.float(), *params, n_steps=20, step_size=0.05, noise_scale=0.3, seed=2, offset=0)
    half = chain(start, *params, n_steps=20, step_size=0.05, noise_scale=0.3, seed=2, offset=0)
    # math in float32, the state rounded (to nearest even, as torch rounds) once, when stored
    assert half.dtype == dtype
    torch.testing.assert_close(half.float(), full.to(dtype).float(), rtol=0, atol=0)


def test_differentiable_calls_take_the_reference_path():
    x, mean, precision = sample_inputs("gaussian_energy", 8, 3)
    x.requires_grad_(True)
    e = BACKEND.kernels["gaussian_energy"].fn(x, mean, precision)
    (g,) = torch.autograd.grad(e.sum(), x)
    torch.testing.assert_close(g, ref.gaussian_gradient(x.detach(), mean, precision))


def _opcheck_cases():
    """Sample arguments for every ``torch.ops.ebm_cuda`` op (float32 on the CPU), per-chain tunables included."""
    x, mean, precision = sample_inputs("gaussian_energy", 8, 3, dtype=torch.float32)
    h = torch.full((8,), 0.01)
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(16, 3, generator=g) * 0.5, torch.randn(1, 16, generator=g) * 0.25]
    bs = [torch.randn(16, generator=g) * 0.1, None]
    img = torch.randn(4, 2, 5, 5, generator=g)
    conv_w = [torch.randn(4, 2, 3, 3, generator=g) * 0.3, torch.randn(1, 4, generator=g) * 0.5]
    conv_b = [torch.randn(4, generator=g) * 0.1, torch.zeros(1)]
    return {
        "energy": (x, 0, mean, precision, 0.0, 0.0, True),
        "langevin_chain": (x, 0, mean, precision, 0.0, 0.0, 3, 0.01, 0.1, None, None, 1, 0),
        "hmc_chain": (x, 0, mean, precision, 0.0, 0.0, 3, 0.0, h, 4, 1.0, 1, 0),
        "nuts_chain": (x, 0, mean, precision, 0.0, 0.0, 2, 0.1, None, 4, 1.0, 1, 0),
        "feedforward_langevin_chain": (x, ws, bs, [0], -1.0, 3, 0.01, 0.0, None, h * 10, 2, 5),
        "conv_langevin_chain": (img, conv_w, conv_b, [1], 1, 1.0, 2, 0.5, 0.05, None, None, 3, 0),
        "langevin_step_philox": (x, torch.randn(8, 3, generator=g), 0.0, 0.1, h, None, 4, 7),
        "langevin_step": (x, torch.randn(8, 3, generator=g), torch.randn(8, 3, generator=g), 0.01, 0.0, None, h),
        # the losses' ops: one layer without a bias, so that the bias gradients of only the others travel
        "feedforward_denoising_score_matching": (x, torch.randn(8, 3, generator=g), h * 50, ws, bs, [0], 1.0),
        "feedforward_sliced_score_matching": (x, torch.randn(8, 3, generator=g), ws, [None, torch.zeros(1)], [2], -1.0),
        "feedforward_energy_gradients": (x, h, None, ws, [bs[0], torch.zeros(1)], [0], 1.0),
        "feedforward_contrastive_chain": (x, h, h * 2, -h, None, ws, bs, [1], 1.0, 2, 0.01, 0.1, None, None, 3, 1),
    }


def test_every_custom_op_passes_torch_library_opcheck():
    """Schema, fake implementation and dispatch of each ``torch.ops.ebm_cuda`` op (every op the package defines: the
    chains, the steps and the losses'), and the eager call (``ops.call``) gives what the op gives. The Triton kernels'
    two ops (``triton_*``) run on CPU tensors only under Triton's interpreter: ``test_triton_chains.py`` and
    ``test_triton_contrastive.py`` opcheck them there."""
    cases = _opcheck_cases()
    defined = {
        name
        for name in dir(torch.ops.ebm_cuda)
        if isinstance(getattr(torch.ops.ebm_cuda, name), torch._ops.OpOverloadPacket) and not name.startswith("triton_")
    }
    assert defined == set(cases), f"ops without an opcheck case: {defined - set(cases)}"
    for name, args in cases.items():
        torch.library.opcheck(getattr(torch.ops.ebm_cuda, name).default, args)
        through_op, eager = _tensors(getattr(torch.ops.ebm_cuda, name)(*args)), _tensors(ops.call(name, *args))
        assert len(through_op) == len(eager) and all(torch.equal(a, b) for a, b in zip(through_op, eager)), name


def test_ops_gathers_each_public_name_from_the_one_module_that_defines_it():
    """``ebm_cuda.ops`` is what users and the docs import: each name of its ``__all__`` is the object of the one module
    that holds it (the shared dispatch, the analytic energies' ops, the network ops, the stream, the tests' helpers).
    The package itself imports those modules, not ``ops``: loading the backends leaves it unloaded."""
    import subprocess
    import sys

    from ebm_cuda import analytic_ops, contrastive_op, conv_ops, dispatch, feedforward_ops, philox

    for name in ops.__all__:
        homes = [m for m in (analytic_ops, dispatch, feedforward_ops, contrastive_op, conv_ops, philox) if name in m.__all__]
        assert len(homes) == 1 and getattr(ops, name) is getattr(homes[0], name), name
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, ebm_cuda.backends, ebm_cuda.plugin; "
            "print(sorted(m for m in sys.modules if m in ('ebm_cuda.ops', 'ebm_cuda.testing')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert loaded.strip() == "[]"


def _tensors(out) -> list:
    """An op's outputs flattened: a tensor, or tuples and lists of them."""
    return [t for part in out for t in _tensors(part)] if isinstance(out, (tuple, list)) else [out]


def test_bad_inputs_are_refused_with_the_fix():
    chain = BACKEND.kernels["harmonic_langevin_chain"].fn
    x, params = _chain_args("harmonic", 3)
    with pytest.raises(InputError, match=r"\(n_chains, dim\)"):
        chain(x[0], *params, n_steps=1, step_size=0.1, noise_scale=0.1, seed=0, offset=0)
    with pytest.raises(InputError, match="seed and offset"):
        chain(x, *params, n_steps=1, step_size=0.1, noise_scale=0.1, seed=-1, offset=0)
    with pytest.raises(InputError, match="dtype"):
        chain(x.to(torch.int32), *params, n_steps=1, step_size=0.1, noise_scale=0.1, seed=0, offset=0)
    with pytest.raises(InputError, match="does not fit dim"):
        chain(x, torch.zeros(5), 1.0, n_steps=1, step_size=0.1, noise_scale=0.1, seed=0, offset=0)
    with pytest.raises(InputError, match="step_sizes"):
        chain(x, *params, n_steps=1, step_size=torch.ones(2), noise_scale=0.1, seed=0, offset=0)


def test_zero_steps_return_the_input_and_the_input_is_never_written():
    x, params = _chain_args("gaussian", 3)
    before = x.clone()
    assert torch.equal(
        BACKEND.kernels["gaussian_langevin_chain"].fn(x, *params, n_steps=0, step_size=0.1, noise_scale=0.1, seed=0, offset=0), x
    )
    out, acc, div = BACKEND.kernels["gaussian_hmc_chain"].fn(
        x, *params, n_steps=0, step_size=0.1, n_leapfrog_steps=2, inverse_temperature=1.0, seed=0, offset=0
    )
    assert torch.equal(out, x) and acc.sum() == 0 and div.sum() == 0
    BACKEND.kernels["gaussian_langevin_chain"].fn(x, *params, n_steps=3, step_size=0.1, noise_scale=0.1, seed=0, offset=0)
    BACKEND.kernels["langevin_step_philox"].fn(x, x, 0.1, 0.1, seed=0, offset=0)
    assert torch.equal(x, before)


def test_results_do_not_depend_on_the_thread_count():
    x, params = _chain_args("gaussian", 5)
    x = x.repeat(40, 1)  # several tiles per thread
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            lang = BACKEND.kernels["gaussian_langevin_chain"].fn(
                x, *params, n_steps=5, step_size=0.01, noise_scale=0.1, seed=3, offset=0
            )
            hmc = BACKEND.kernels["gaussian_hmc_chain"].fn(
                x, *params, n_steps=3, step_size=0.1, n_leapfrog_steps=3, inverse_temperature=1.0, seed=3, offset=0
            )
            outs.append((lang, *hmc))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def test_step_kernels_check_their_other_inputs():
    x = torch.randn(10, 3)
    with pytest.raises(InputError, match="grad must have the shape of x"):
        BACKEND.kernels["langevin_step_philox"].fn(x, x[:1], 0.1, 0.1, seed=0, offset=0)
    with pytest.raises(InputError, match="noise must have the shape of x"):
        BACKEND.kernels["langevin_step"].fn(x, x, x[:, :2], 0.1, 0.1)
    with pytest.raises(InputError, match="needs its parameter tensors"):
        ops.call("energy", x, ops.KINDS["harmonic"], None, None, 1.0, 0.0, False)


def test_step_kernels_take_states_of_any_event_shape():
    x, grad, noise = torch.randn(3, 6, 2, 4, dtype=torch.float64).unbind(0)
    got = BACKEND.kernels["langevin_step"].fn(x, grad, noise, 0.1, 0.3)
    torch.testing.assert_close(got, ref.langevin_step(x, grad, noise, 0.1, 0.3))
    stepped = BACKEND.kernels["langevin_step_philox"].fn(x, grad, 0.1, 0.3, seed=1, offset=2)
    expected = x - 0.1 * grad + 0.3 * reference.normal(6, 8, 1, 2).double().view(6, 2, 4)
    torch.testing.assert_close(stepped, expected, rtol=1e-6, atol=1e-6)


def test_the_python_and_c_chain_dimension_limits_agree():
    from ebm_cuda import build, ops

    assert f"#define EBM_MAX_D {ops.MAX_CUDA_CHAIN_DIM}" in (build.CSRC / "ebm" / "dispatch.h").read_text()
