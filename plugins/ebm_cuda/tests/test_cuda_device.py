"""On a GPU machine: the CUDA build equals the host build on the same Philox stream, samples correctly,
and is what resolution picks; forcing torch works. Skips without a GPU; with a GPU, CUDA kernels that
cannot run (nvcc missing, a failed build) fail every test here (``ebm_cuda.testing.require_cuda_kernels``)."""

import pytest
import torch

import ebmcore
from ebmcore.kernels.ops import sample_inputs
from ebm_cuda import ops
from ebm_cuda.backends import CudaBackend, HostBackend
from ebm_cuda.testing import assert_chains_close, require_cuda_kernels
from ebm_samplers import HMCSampler, LangevinSampler

pytestmark = pytest.mark.gpu

ENERGIES = list(ops.KINDS)  # the energies of csrc/ebm/energies.h
CUDA = HOST = None


@pytest.fixture(autouse=True)
def cuda_kernels():
    """Skip where there is no GPU; fail where there is one and the CUDA kernels cannot run on it."""
    global CUDA, HOST
    require_cuda_kernels()
    if CUDA is None:
        CUDA, HOST = CudaBackend(), HostBackend()


def test_philox_and_normals_equal_the_host_build():
    g = torch.Generator().manual_seed(0)
    counters = torch.randint(0, 2**32, (4096, 4), generator=g)
    keys = torch.randint(0, 2**32, (4096, 2), generator=g)
    assert torch.equal(ops.philox4x32(counters.cuda(), keys.cuda()).cpu(), ops.philox4x32(counters, keys))
    torch.testing.assert_close(
        ops.normal(5000, 7, 11, 2**33, device="cuda").cpu(), ops.normal(5000, 7, 11, 2**33), rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("d", [2, 10, 40])
@pytest.mark.parametrize("name", ENERGIES)
def test_energies_and_chains_equal_the_host_build(name, d):
    x, *params = sample_inputs(f"{name}_energy", 3000, d, dtype=torch.float32)
    x = 0.3 * x if name == "rosenbrock" else x
    cuda_params = [p.cuda() if isinstance(p, torch.Tensor) else p for p in params]
    for op in (f"{name}_energy", f"{name}_gradient"):
        torch.testing.assert_close(
            CUDA.kernels[op].fn(x.cuda(), *cuda_params).cpu(), HOST.kernels[op].fn(x, *params), rtol=1e-4, atol=1e-4
        )
    h = 1e-3 if name == "rosenbrock" else 0.01
    kw = dict(n_steps=50, step_size=h, noise_scale=(2 * h) ** 0.5, seed=123, offset=9)
    # a chain that diverges (about one d = 40 double-well or Rosenbrock chain in 3,000) does so on both builds
    assert_chains_close(
        CUDA.kernels[f"{name}_langevin_chain"].fn(x.cuda(), *cuda_params, **kw),
        HOST.kernels[f"{name}_langevin_chain"].fn(x, *params, **kw),
        rtol=1e-4,
        atol=1e-4,
        what="langevin chain",
    )
    kw = dict(n_steps=5, step_size=h, n_leapfrog_steps=4, inverse_temperature=1.0, seed=7, offset=0)
    gx, ga, gd = CUDA.kernels[f"{name}_hmc_chain"].fn(x.cuda(), *cuda_params, **kw)
    hx, ha, hd = HOST.kernels[f"{name}_hmc_chain"].fn(x, *params, **kw)
    same = (ga.cpu() == ha) & (gd.cpu() == hd)  # accept decisions agree up to ties at float tolerance
    assert (~same).float().mean() < 0.01, f"accept or divergence counts differ in {int((~same).sum())} chains"
    assert_chains_close(gx.cpu()[same], hx[same], rtol=1e-4, atol=1e-4, what="hmc chain")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_chains_equal_the_host_build(dtype):
    x, center, k = sample_inputs("harmonic_energy", 4096, 8)
    kw = dict(n_steps=20, step_size=0.05, noise_scale=0.3, seed=2, offset=0)
    got = CUDA.kernels["harmonic_langevin_chain"].fn(x.to(dtype).cuda(), center.cuda(), k, **kw).cpu()
    expected = HOST.kernels["harmonic_langevin_chain"].fn(x.to(dtype), center, k, **kw)
    assert got.dtype == dtype
    assert (got.float() - expected.float()).abs().max() <= 2 * torch.finfo(dtype).eps * expected.float().abs().max()


def test_resolution_picks_cuda_and_torch_can_be_forced():
    x = torch.randn(8, 3, device="cuda")
    assert ebmcore.explain("gaussian_gradient", x).chosen.backend == "cuda"
    assert ebmcore.explain("gaussian_langevin_chain", x).chosen.backend == "cuda"
    with ebmcore.use_backend("torch"):
        assert ebmcore.explain("gaussian_gradient", x).chosen.backend == "torch"
    assert ebmcore.explain("gaussian_gradient", x.double()).chosen.backend == "torch"  # float64: reference


def test_fused_sampling_on_the_gpu_has_the_right_moments():
    k, h, n, d = 2.0, 0.2, 100_000, 4
    energy = ebmcore.energy("harmonic", dim=d, stiffness=k).cuda()
    out = LangevinSampler(energy, step_size=h, fused=True).sample(
        torch.zeros(n, d, device="cuda"), 200, generator=torch.Generator("cuda").manual_seed(1)
    )
    var = 1.0 / (k * (1 - h * k / 2))
    assert abs(out.var(0).mean().item() - var) < 5 * var * (2.0 / (n * d)) ** 0.5
    res = HMCSampler(energy, step_size=0.3, n_leapfrog_steps=5, fused=True).sample(
        torch.zeros(n, d, device="cuda"), 20, burn_in=20, return_diagnostics=True
    )
    assert abs(res.samples.var(0).mean().item() - 1 / k) < 5 * (1 / k) * (2.0 / (n * d)) ** 0.5
    assert res.diagnostics.acceptance_rate.mean() > 0.8


def test_several_batches_on_separate_streams():
    from ebm_cuda.streams import gradients_on_streams

    energy = ebmcore.energy("gaussian", mean=torch.zeros(6), covariance=torch.eye(6) * 2).cuda()
    batches = [torch.randn(1000 + 10 * i, 6, device="cuda") for i in range(4)]
    grads = gradients_on_streams(energy, batches)
    for b, g in zip(batches, grads):
        torch.testing.assert_close(g, energy.gradient(b))
