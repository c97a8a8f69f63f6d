"""The Triton chain of ``ebm_cuda.triton_chains`` tested without a GPU.

- Under Triton's interpreter, on CPU tensors at small sizes: ``TRITON_INTERPRET=1`` must be in the environment before
  triton is imported, so the checks run in one child process (``python test_triton_chains.py interpreted``) started
  with it, and each test below asserts on what that process measured (only the GPU test imports triton in this one).
- Compiled for sm_80 and sm_90 with ``triton.compile`` (no GPU needed), in a second child process without the
  interpreter: registers and spills from Triton's ``ptxas -v``, recorded in the test's output; no spills with IEEE
  products, TF32's bounded.
- On a GPU (marked ``gpu``): the compiled kernel against the host build.

Skipped, saying so, where triton is not installed (``make setup`` installs it), but for the refusals and resolution.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from typing import Any

import pytest
import torch

import ebmcore
from ebmcore.energies.program import feedforward_of
from ebm_cuda.testing import bf16_products_pass, run_triton_child, triton_chain_with_noise

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install triton==3.7.1; make setup installs it)",
)

N = 37  # chains: not a multiple of any block size used
D = 3  # state width, padded to 16 in the kernel
WIDTHS = (D, 40, 17, 5)  # hidden widths that are not powers of 2 (padded to 64, 32, 16)
ACTIVATIONS = ("SiLU", "Tanh", "Sigmoid", "ReLU", "LeakyReLU", "ELU")
_WITH_PARAMETERS = {"LeakyReLU": lambda: torch.nn.LeakyReLU(0.2), "ELU": lambda: torch.nn.ELU(0.7)}
"""The activations whose codes carry a parameter, with one other than the default (the kernel must read it)."""
LAW_SAMPLES = 640 * 13 * 2  # normals drawn for the law check: (n, d) = (640, 13) at two steps


def _network(depth: int, activation: str, seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for i in range(depth):
        layers += [torch.nn.Linear(WIDTHS[i], WIDTHS[i + 1]), _WITH_PARAMETERS.get(activation, getattr(torch.nn, activation))()]
    layers.append(torch.nn.Linear(WIDTHS[depth], 1))
    return torch.nn.Sequential(*layers)


def _autograd_gradient(net: torch.nn.Sequential, sign: float, x: torch.Tensor) -> torch.Tensor:
    """``∇ₓ(sign · net(x))`` by autograd in float64."""
    import copy

    net64 = copy.deepcopy(net).double()
    x64 = x.double().requires_grad_()
    (grad,) = torch.autograd.grad((sign * net64(x64)).sum(), x64)
    return grad


def _opcheck(op: Any, args: tuple) -> str:
    """``torch.library.opcheck(op, args)``: "ok", or what failed."""
    try:
        torch.library.opcheck(op, args)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return f"{type(exc).__name__}: {exc}"[:2000]
    return "ok"


def _interpreted_checks() -> dict[str, Any]:
    """Everything measured under the interpreter (run in the child process; returns plain numbers)."""
    assert os.environ.get("TRITON_INTERPRET") == "1" and "triton" not in sys.modules
    from ebm_cuda import reference, triton_chains as tc

    chain = tc.feedforward_langevin_chain
    results: dict[str, Any] = {}
    x0 = torch.randn(N, D, generator=torch.Generator().manual_seed(1))

    # the gradient: one step with h = 1 and no noise is x − ∇E(x)
    gradient = {}
    for depth in (1, 2, 3):
        for activation in ACTIVATIONS:
            for sign in (1.0, -1.0):
                net = _network(depth, activation)
                out = chain(x0, feedforward_of(net, sign), n_steps=1, step_size=1.0, noise_scale=0.0, seed=0, offset=0)
                expected = _autograd_gradient(net, sign, x0)
                gradient[f"{depth}-{activation}-{sign:+.0f}"] = ((x0 - out).double() - expected).abs().max().item() / (
                    1.0 + expected.abs().max().item()
                )
    results["gradient"] = gradient

    # a trajectory with the noise read from a tensor against the torch reference x − h∇E + s·ξ (per-chain h, s)
    net = _network(2, "SiLU")
    program = feedforward_of(net, 1.0)

    # the op under the function: torch.library's opcheck (schema, fake, dispatch; the seed as a negative int64), and
    # the function's states equal the op's
    tensors, padded, acts = tc.kernel_arguments(program, x0.device)
    seed = 2**64 - 5
    args = (
        x0[:5],
        torch.empty(5, D),
        tensors,
        list(padded),
        list(acts),
        2,
        0.02,
        0.3,
        None,
        torch.full((5,), 0.2),
        seed - 2**64,
        1,
        "ieee",
        16,
        8,
        None,
    )
    results["opcheck"] = _opcheck(torch.ops.ebm_cuda.triton_langevin_chain.default, args)
    torch.ops.ebm_cuda.triton_langevin_chain(*args)
    results["op_vs_function"] = (
        (
            args[1]
            - chain(
                x0[:5], program, n_steps=2, step_size=0.02, noise_scale=torch.full((5,), 0.2), seed=seed, offset=1, num_warps=8
            )
        )
        .abs()
        .max()
        .item()
    )
    steps = 10
    xi = torch.randn(steps, N, D, generator=torch.Generator().manual_seed(2))
    h = torch.linspace(0.01, 0.05, N)
    s = torch.linspace(0.1, 0.3, N)
    out = triton_chain_with_noise(x0, program, xi, n_steps=steps, step_size=h, noise_scale=s, seed=0, offset=0)
    ref = x0.double()
    for t in range(steps):
        ref = ref - h.double()[:, None] * _autograd_gradient(net, 1.0, ref) + s.double()[:, None] * xi[t].double()
    results["trajectory"] = (out.double() - ref).abs().max().item()

    # the in-kernel stream: equal to the documented one (ebm_cuda.reference.normal, float64 Box–Muller rounded) to float32
    # rounding, and to the same normals read from a tensor to the bit
    seed, offset = 2**40 + 12345, 2**32 - 2  # the step counter crosses 2^32 within the chain
    normals = [tc.stream_normals(N, D, seed, offset + t, device="cpu") for t in range(4)]
    results["stream_vs_reference"] = max(
        (z - reference.normal(N, D, seed, offset + t)).abs().max().item() for t, z in enumerate(normals)
    )
    # a width the chain pads to 64 (not a multiple of 16 either)
    results["stream_vs_reference_d40"] = (
        (tc.stream_normals(5, 40, seed, offset, device="cpu") - reference.normal(5, 40, seed, offset)).abs().max().item()
    )
    in_kernel = chain(x0, program, n_steps=4, step_size=0.02, noise_scale=0.5, seed=seed, offset=offset)
    from_tensor = triton_chain_with_noise(
        x0, program, torch.stack(normals), n_steps=4, step_size=0.02, noise_scale=0.5, seed=seed, offset=offset
    )
    results["in_kernel_vs_tensor"] = (in_kernel - from_tensor).abs().max().item()
    # 64 chains per program draw the normals of the first 4 columns only (noise_columns), widened with zeros: the same
    # values, to the bit
    narrow = chain(x0, program, n_steps=4, step_size=0.02, noise_scale=0.5, seed=seed, offset=offset, block_n=64)
    narrow_from_tensor = triton_chain_with_noise(
        x0, program, torch.stack(normals), n_steps=4, step_size=0.02, noise_scale=0.5, seed=seed, offset=offset, block_n=64
    )
    results["narrow_in_kernel_vs_tensor"] = (narrow - narrow_from_tensor).abs().max().item()
    zero = feedforward_of(torch.nn.Sequential(torch.nn.Linear(D, 16), torch.nn.SiLU(), torch.nn.Linear(16, 1)), 1.0)
    for p in zero.layers[0].linear.parameters():
        torch.nn.init.zeros_(p)
    moved = chain(torch.zeros(N, D), zero, n_steps=1, step_size=0.1, noise_scale=1.0, seed=seed, offset=offset + 1)
    results["zero_energy_step_vs_stream"] = (moved - normals[1]).abs().max().item()

    # the law: mean 0 and variance 1
    law = torch.cat([tc.stream_normals(640, 13, 7, t, device="cpu").reshape(-1) for t in (0, 1)]).double()
    results["law"] = {"n": law.numel(), "mean": law.mean().item(), "var": law.var().item()}

    # restarts: 5 + 5 steps equal 10
    ten = chain(x0, program, n_steps=10, step_size=0.02, noise_scale=0.3, seed=5, offset=3)
    five = chain(x0, program, n_steps=5, step_size=0.02, noise_scale=0.3, seed=5, offset=3)
    five = chain(five, program, n_steps=5, step_size=0.02, noise_scale=0.3, seed=5, offset=8)
    results["restart"] = (ten - five).abs().max().item()

    # block sizes, and a chain count that is not a multiple of the block: the chains beyond n are not written
    blocks = {
        b: chain(x0, program, n_steps=3, step_size=0.02, noise_scale=0.3, seed=5, offset=0, block_n=b) for b in (16, 32, 64, 128)
    }
    results["block_sizes"] = max((blocks[b] - blocks[16]).abs().max().item() for b in blocks)
    buffer = torch.full((64, D), float("nan"))
    chain(x0, program, n_steps=3, step_size=0.02, noise_scale=0.3, seed=5, offset=0, block_n=32, out=buffer[:N])
    results["ragged_untouched"] = bool(buffer[N:].isnan().all())
    results["ragged_written"] = (buffer[:N] - blocks[16]).abs().max().item()
    more = torch.cat([x0, torch.randn(11, D)])  # 48 chains: the first 37 move as before
    results["more_chains"] = (
        (chain(more, program, n_steps=3, step_size=0.02, noise_scale=0.3, seed=5, offset=0)[:N] - blocks[16]).abs().max().item()
    )
    strided = torch.randn(N, 2 * D)
    strided[:, :D] = x0
    results["strided_input"] = (
        (chain(strided[:, :D], program, n_steps=3, step_size=0.02, noise_scale=0.3, seed=5, offset=0) - blocks[16])
        .abs()
        .max()
        .item()
    )

    # a negated network (E = −net) equals the network with its last layer negated
    negated_net = _network(2, "Tanh")
    flipped = _network(2, "Tanh")
    with torch.no_grad():
        flipped[-1].weight.neg_()
        flipped[-1].bias.neg_()
    negated = chain(x0, feedforward_of(negated_net, -1.0), n_steps=4, step_size=0.03, noise_scale=0.2, seed=9, offset=0)
    positive = chain(x0, feedforward_of(flipped, 1.0), n_steps=4, step_size=0.03, noise_scale=0.2, seed=9, offset=0)
    results["negated"] = (negated - positive).abs().max().item()
    results["negated_moves"] = (negated - x0).abs().max().item()

    # bfloat16 and float16 states: float32 math, rounded once when stored
    for dtype in (torch.bfloat16, torch.float16):
        low = x0.to(dtype)
        out = chain(low, program, n_steps=4, step_size=0.02, noise_scale=0.3, seed=5, offset=0)
        full = chain(low.float(), program, n_steps=4, step_size=0.02, noise_scale=0.3, seed=5, offset=0).to(dtype)
        results[f"{dtype}".removeprefix("torch.")] = {
            "dtype": str(out.dtype),
            "diff": (out.float() - full.float()).abs().max().item(),
        }

    # the host build (cpu_fused) on the same seed draws the same stream: the chains agree to float32 rounding
    from ebm_cuda.feedforward_ops import _langevin_chain_kernel as host_chain

    host = {}
    for depth in (1, 2, 3):
        for activation in ACTIVATIONS:
            p = feedforward_of(_network(depth, activation), -1.0 if depth == 2 else 1.0)
            kw = dict(n_steps=8, step_size=0.02, noise_scale=0.2, seed=2**33 + 7, offset=11)
            host[f"{depth}-{activation}"] = (chain(x0, p, **kw) - host_chain(x0, p, **kw)).abs().max().item()
    results["host_build"] = host

    # a sampler picks the kernel where a backend offers it (here registered for the CPU, as the triton backend is for
    # CUDA) and runs it with the seed it draws
    from ebmcore import Kernel, KernelBackend, SequentialEnergy, hookimpl
    from ebmcore.testing import isolated_plugins
    from ebm_samplers import LangevinSampler

    class Interpreted:
        @hookimpl
        def ebm_register_kernels(self, registry):
            registry.register_kernel_backend(
                KernelBackend(
                    "triton_interpreted",
                    [
                        Kernel(
                            "feedforward_langevin_chain", chain, ("cpu",), tc.DTYPES, None, 20, tc.MAX_WIDTH, refuses=tc.refusal
                        )
                    ],
                )
            )

    before = torch.get_float32_matmul_precision()
    try:
        with isolated_plugins(("interpreted", Interpreted())):
            # TF32 products (measured faster on an H100): the chain at fused=None, its products in the path
            sampler = LangevinSampler(SequentialEnergy(net), step_size=0.01, precision="tf32")
            results["sampler_path"] = sampler.prepare(x0, None, {}).path
            sampled = sampler.sample(x0, 4, burn_in=2, generator=torch.Generator().manual_seed(2))
            # torch's switch at "highest": IEEE products, measured no faster, so not at fused=None; fused=True takes them
            torch.set_float32_matmul_precision("highest")
            results["ieee_path"] = LangevinSampler(SequentialEnergy(net), step_size=0.01).prepare(x0, None, {}).path
            forced = LangevinSampler(SequentialEnergy(net), step_size=0.01, fused=True)
            results["ieee_forced_path"] = forced.prepare(x0, None, {}).path
            torch.set_float32_matmul_precision("medium")  # bfloat16 products, measured faster
            results["medium_path"] = LangevinSampler(SequentialEnergy(net), step_size=0.01).prepare(x0, None, {}).path
    finally:
        torch.set_float32_matmul_precision(before)
    seed = int(torch.randint(0, 2**62, (), generator=torch.Generator().manual_seed(2)))  # the key a fused run draws
    direct = chain(x0, program, n_steps=6, step_size=0.01, noise_scale=0.02**0.5, seed=seed, offset=0, precision="tf32")
    results["sampler_vs_direct"] = (sampled - direct).abs().max().item()

    # precision: every name runs; the interpreter computes IEEE, split TF32 and TF32 products alike, in float32
    runs = {
        p: chain(x0, program, n_steps=2, step_size=0.02, noise_scale=0.3, seed=5, offset=0, precision=p)
        for p in ("ieee", "tf32x3", "tf32")
    }
    results["tf32_runs"] = runs["tf32"].shape == (N, D)
    results["products_vs_ieee"] = {p: (r - runs["ieee"]).abs().max().item() for p, r in runs.items()}

    # bfloat16 products (emulated under the interpreter, whose bfloat16 tl.dot is broken: the same exact products of
    # the rounded operands): the gradient against the same rounding done by torch, and against the exact gradient
    bf16 = {"close": 0, "count": 0, "vs_emulation": 0.0, "vs_exact": []}
    for seed in range(3):
        net = _network(3, "SiLU")
        torch.nn.init.normal_(net[0].weight, generator=torch.Generator().manual_seed(seed))
        out = chain(x0, feedforward_of(net, -1.0), n_steps=1, step_size=1.0, noise_scale=0.0, seed=0, offset=0, precision="bf16")
        got, emulated, exact = (x0 - out).double(), bf16_products_pass(net, -1.0, x0)[0], _autograd_gradient(net, -1.0, x0)
        scale = 1.0 + exact.abs().max().item()
        bf16["close"] += int(((got - emulated).abs() <= 1e-6 * scale).sum())
        bf16["count"] += got.numel()
        bf16["vs_emulation"] = max(bf16["vs_emulation"], (got - emulated).abs().max().item() / scale)
        bf16["vs_exact"].append((got - exact).abs().max().item() / scale)
    results["bf16_products"] = bf16
    return results


def _compile_checks() -> dict[str, Any]:
    """Registers and spills of the kernel compiled for sm_80 and sm_90 (run in the child process, no interpreter)."""
    assert "TRITON_INTERPRET" not in os.environ
    from ebm_cuda.kernel_report import compile_report, normals_compile_report

    configs = {
        "2-64-64-1 silu float32 ieee": dict(widths=(2, 64, 64)),
        "64-64-64-64-1 silu float32 ieee": dict(widths=(64, 64, 64, 64)),
        "2-64-64-1 silu bfloat16 tf32": dict(widths=(2, 64, 64), dtype=torch.bfloat16, precision="tf32"),
        "2-64-64-1 silu float32 bf16": dict(widths=(2, 64, 64), precision="bf16"),
    }
    reports = {f"sm_{cc} {name}": compile_report(cc, **kw) for cc in (80, 90) for name, kw in configs.items()}
    # the variants the tests use (noise from a tensor, per-chain step sizes), and the other activations and a ragged
    # depth: compiled once, for sm_90
    reports["sm_90 3-40-17-5-1 tanh/sigmoid/relu float32 ieee, tensor noise, per-chain h and s"] = compile_report(
        90, widths=WIDTHS, activations=(1, 2, 3), noise_from_tensor=True, per_chain=True
    )
    reports["sm_90 2-32-1 relu float16 ieee"] = compile_report(90, widths=(2, 32), activations=(3,), dtype=torch.float16)
    # the configuration launch_config replaced (16 chains per program; 8 warps with TF32 products, 16 with IEEE ones)
    for precision, warps in (("tf32", 8), ("ieee", 16)):
        reports[f"sm_90 2-64-64-1 silu float32 {precision}, 16 chains on {warps} warps"] = compile_report(
            90, widths=(2, 64, 64), precision=precision, block_n=16, num_warps=warps
        )
    reports["sm_90 2-64-64-1 silu float32 tf32"] = compile_report(90, widths=(2, 64, 64), precision="tf32")
    for cc in (80, 90):  # the kernel of stream_normals
        reports[f"sm_{cc} normals d=40"] = normals_compile_report(cc, d=40)
    return reports


def _child(what: str, interpret: bool, cache: str | None = None) -> dict[str, Any]:
    return run_triton_child(__file__, what, interpret, cache)


@pytest.fixture(scope="module")
def interpreted() -> dict[str, Any]:
    return _child("interpreted", interpret=True)


@needs_triton
def test_gradient_equals_autograd_for_every_activation_depth_and_sign(interpreted):
    assert len(interpreted["gradient"]) == 3 * len(ACTIVATIONS) * 2
    worst = max(interpreted["gradient"].values())
    assert worst < 2e-6, interpreted["gradient"]  # float32 products against float64 autograd, relative to |∇E|


@needs_triton
def test_trajectory_with_noise_from_a_tensor_equals_the_torch_reference(interpreted):
    assert interpreted["trajectory"] < 2e-5  # 10 steps, per-chain step sizes and noise scales, against float64


@needs_triton
def test_in_kernel_noise_is_the_documented_stream(interpreted):
    assert interpreted["stream_vs_reference"] < 5e-6  # float32 log/cos/sin against the float64 Box–Muller of reference.py
    assert interpreted["stream_vs_reference_d40"] < 5e-6
    assert interpreted["in_kernel_vs_tensor"] == 0.0  # the chain adds exactly stream_normals' values
    assert interpreted["narrow_in_kernel_vs_tensor"] == 0.0  # also where it draws 4 of the 16 columns and widens them
    assert interpreted["zero_energy_step_vs_stream"] == 0.0


@needs_triton
def test_in_kernel_noise_is_standard_normal(interpreted):
    law = interpreted["law"]
    n = law["n"]
    assert n == LAW_SAMPLES
    # 5 standard errors: a false alarm once in ~1.7 million runs (the stream is fixed, so this is a check of the
    # transform, not a flaky test). Standard errors: 1/sqrt(n) for the mean, sqrt(2/n) for the variance of a normal.
    assert abs(law["mean"]) < 5 / math.sqrt(n)
    assert abs(law["var"] - 1) < 5 * math.sqrt(2 / n)


@needs_triton
def test_the_op_passes_opcheck_and_is_what_the_function_runs(interpreted):
    assert interpreted["opcheck"] == "ok"
    assert interpreted["op_vs_function"] == 0.0


def test_the_op_refuses_cpu_tensors_outside_the_interpreter():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("this process runs Triton's interpreter")
    from ebm_cuda import triton_chains as tc
    from ebmcore.errors import InputError

    program = feedforward_of(torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.SiLU(), torch.nn.Linear(8, 1)))
    tensors, padded, acts = tc.kernel_arguments(program, torch.device("cpu"))
    x = torch.randn(5, 2)
    with pytest.raises(InputError, match="run on CUDA tensors, got cpu .*TRITON_INTERPRET=1"):
        torch.ops.ebm_cuda.triton_langevin_chain(
            x, torch.empty_like(x), tensors, list(padded), list(acts), 1, 0.1, 0.1, None, None, 0, 0, "ieee", 16, 8, None
        )
    with pytest.raises(InputError, match="seed must be in \\[0, 2\\^64\\)"):
        tc.feedforward_langevin_chain(x, program, n_steps=1, step_size=0.1, noise_scale=0.1, seed=-1, offset=0)


@needs_triton
def test_restart_five_plus_five_steps_equal_ten(interpreted):
    assert interpreted["restart"] == 0.0


@needs_triton
def test_block_size_and_chain_count_do_not_change_a_chain(interpreted):
    # 16, 32, 64, 128 chains per program: the interpreter's products (numpy) differ in the last bit with the block's rows
    assert interpreted["block_sizes"] < 1e-6
    assert interpreted["more_chains"] == 0.0  # the same chains among 48 instead of 37
    assert interpreted["strided_input"] == 0.0  # a column slice of a wider tensor


@needs_triton
def test_a_chain_count_not_a_multiple_of_the_block_is_masked(interpreted):
    assert interpreted["ragged_untouched"]  # 37 chains in blocks of 32: rows 37..63 of the buffer keep their NaN
    assert interpreted["ragged_written"] == 0.0


@needs_triton
def test_a_negated_network_equals_its_last_layer_negated(interpreted):
    assert interpreted["negated"] == 0.0
    assert interpreted["negated_moves"] > 0.01


@needs_triton
def test_the_chain_equals_the_host_build_on_the_same_seed(interpreted):
    assert len(interpreted["host_build"]) == 3 * len(ACTIVATIONS)
    assert max(interpreted["host_build"].values()) < 1e-5, interpreted["host_build"]  # 8 steps, float32 both


@needs_triton
def test_a_sampler_runs_the_kernel_it_resolves(interpreted):
    assert interpreted["sampler_path"].startswith("fused chain (triton_interpreted, tf32 products); gradient: ")
    assert interpreted["sampler_vs_direct"] == 0.0  # one launch of 6 steps, or 2 then 4: the same bits


@needs_triton
def test_the_products_follow_torchs_switch_and_rank_by_measurement(interpreted):
    assert interpreted["ieee_path"].startswith("per-step loop (the feedforward_langevin_chain kernel with ieee products ")
    assert "measured no faster than the per-step loop" in interpreted["ieee_path"], interpreted["ieee_path"]
    assert interpreted["ieee_forced_path"].startswith("fused chain (triton_interpreted, ieee products); gradient: ")
    assert interpreted["medium_path"].startswith("fused chain (triton_interpreted, bf16 products); gradient: ")
    # under the interpreter the three float32 products are one computation (it ignores input_precision)
    assert interpreted["products_vs_ieee"] == {"ieee": 0.0, "tf32x3": 0.0, "tf32": 0.0}


@needs_triton
def test_bfloat16_and_float16_states_round_once_at_the_end(interpreted):
    for name in ("bfloat16", "float16"):
        assert interpreted[name] == {"dtype": f"torch.{name}", "diff": 0.0}
    assert interpreted["tf32_runs"]


@needs_triton
def test_bfloat16_products_round_every_operand_to_bfloat16(interpreted):
    bf16 = interpreted["bf16_products"]
    # the kernel's float32 sums and activations may put an operand on the other side of a bfloat16 rounding boundary
    # than torch's float64 ones: nearly every element agrees to 1e-6, and none is off by more than such a flip
    assert bf16["close"] >= 0.99 * bf16["count"], bf16
    assert bf16["vs_emulation"] < 5e-4, bf16
    # and the rounding is real: the exact gradient is 1e-4 away (IEEE products: 2e-6 at most, test above)
    assert all(1e-5 < v < 3e-3 for v in bf16["vs_exact"]), bf16


@needs_triton
def test_the_kernel_compiles_for_sm80_and_sm90_within_its_spill_and_instruction_bounds(tmp_path):
    reports = _child("compile", interpret=False, cache=str(tmp_path))  # an empty cache: every build compiles
    for name, report in reports.items():  # in the test's output (pytest -s, or -rA): the registers of each build
        print(
            f"{name}: {report['registers']} registers, {report['spill_stores']} bytes spill stores, "
            f"{report['spill_loads']} bytes spill loads, {report['shared']} bytes shared, {report['seconds']:.1f} s, "
            f"{report['block_n']} chains on {report['num_warps']} warps, {report['per_chain_step']} warp-instructions "
            f"per chain-step"
        )
    assert len(reports) == 15
    assert all(0 < r["registers"] <= 255 for r in reports.values())
    # the step loop's cost (warp-instructions per chain-step, ebm_cuda.kernel_report): the default against the
    # configuration it replaced, for W4's network on sm_90. TF32: 16 chains per warp, one tensor-core tile's rows,
    # and the noise of 4 columns, against 2 chains per warp (each warp's rows computed 8 times over): 77 against
    # 765. IEEE: 4 chains per warp against 1: 505 against 850.
    cost = {name: r["per_chain_step"] for name, r in reports.items() if "normals" not in name}
    assert all(c is not None and c > 0 for c in cost.values()), cost
    assert reports["sm_90 normals d=40"]["per_chain_step"] is None  # no step loop
    tf32, ieee = cost["sm_90 2-64-64-1 silu float32 tf32"], cost["sm_90 2-64-64-1 silu float32 ieee"]
    assert tf32 * 9 < cost["sm_90 2-64-64-1 silu float32 tf32, 16 chains on 8 warps"], cost
    assert ieee * 1.5 < cost["sm_90 2-64-64-1 silu float32 ieee, 16 chains on 16 warps"], cost
    # the counts when chosen, within 15 % either way: a change that costs, or a count that goes wrong, shows. Since
    # the activations' exponentials and reciprocals are one instruction each (_triton_kernels._exp_minus,
    # _reciprocal; before: TF32 111, IEEE 538, bfloat16 products 92)
    for name, count in (
        ("sm_90 2-64-64-1 silu float32 tf32", 77),
        ("sm_90 2-64-64-1 silu float32 ieee", 505),
        ("sm_90 2-64-64-1 silu float32 tf32, 16 chains on 8 warps", 765),
        ("sm_90 2-64-64-1 silu float32 ieee, 16 chains on 16 warps", 850),
        ("sm_90 2-64-64-1 silu float32 bf16", 60),
        ("sm_90 64-64-64-64-1 silu float32 ieee", 1137),
    ):
        assert 0.85 * count < cost[name] < 1.15 * count, (name, cost[name])
    # spills: none (sm_80's 2-64-64-1 kernel with IEEE products had 4 bytes before the activations' change); bounded at
    # launch_config's 64 bytes on sm_80 so that they cannot grow unseen
    assert not [name for name, r in reports.items() if (r["spill_stores"] or r["spill_loads"]) and name.startswith("sm_90")]
    assert all(r["spill_stores"] <= 64 and r["spill_loads"] <= 64 for r in reports.values())


def test_cuda_tensors_on_a_build_without_cuda_are_refused_by_name(monkeypatch):
    # a ROCm build's tensors say "cuda" too; the kernels' activations are PTX, so they are refused before a launch
    from ebm_cuda import triton_chains as tc
    from ebmcore.errors import InputError

    class OnTheGpu:
        device = torch.device("cuda")

    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(InputError, match="written for NVIDIA GPUs .* use the per-step loop"):
        tc._runs_here(OnTheGpu(), "triton_langevin_chain")


def test_refusals_and_resolution_name_their_reason():
    from ebm_cuda import triton_chains as tc

    def program(*modules: torch.nn.Module):
        return feedforward_of(torch.nn.Sequential(*modules))

    lin = torch.nn.Linear
    assert tc.refusal(program(lin(2, 8), torch.nn.SiLU(), lin(8, 1))) is None
    assert (
        tc.refusal(program(lin(2, 8), torch.nn.GELU(), lin(8, 1)))
        == "has no gelu (it takes silu, tanh, sigmoid, relu, leaky_relu, elu)"
    )
    assert tc.refusal(program(lin(2, 1))) == "needs a hidden layer (this energy is linear)"
    deep = [m for _ in range(4) for m in (lin(2, 2), torch.nn.Tanh())]
    assert tc.refusal(program(*deep, lin(2, 1))) == "takes at most 3 hidden layers, the network has 4"
    assert (
        tc.refusal(program(lin(2, 65), torch.nn.ReLU(), lin(65, 1)))
        == "takes layers at most 64 wide, the network has one 65 wide"
    )
    # the products: IEEE unless asked for TF32, by torch's switch for float32 products or by name
    from ebmcore.errors import InputError

    before = torch.get_float32_matmul_precision()
    try:
        for setting, expected in (("highest", "ieee"), ("high", "tf32"), ("medium", "bf16")):
            torch.set_float32_matmul_precision(setting)
            assert tc.products(None) == expected
            assert [tc.products(p) for p in tc.PRECISIONS] == list(tc.PRECISIONS)  # a name overrides the switch
    finally:
        torch.set_float32_matmul_precision(before)
    with pytest.raises(InputError, match="precision must be one of ieee, tf32x3, tf32, bf16 or None"):
        tc.products("tf32x2")
    # the launch configurations chosen from the machine code (benchmarks/triton_static.py; launch_config takes the
    # device sweep's where it measured the network, tests/test_triton_launch_choices.py): 16 chains per warp with tensor-core products (the
    # chain 64 on 4, the contrastive kernel 32 on 4), 16 chains on 4 warps with IEEE ones; fewer where registers run
    # out: a 64-wide state (the contrastive kernel: 16 on 16 with IEEE products, 16 on 4 with tensor-core ones), three
    # 64-wide layers on it (the tensor-core chain: 32 on 8)
    assert [
        tc.static_launch_config(p, q, c)
        for c in (False, True)
        for p in ((16, 64, 64), (64, 64), (64, 64, 64, 64))
        for q in ("ieee", "tf32", "bf16")
    ] == [
        (16, 4),
        (64, 4),
        (64, 4),
        (16, 4),
        (64, 4),
        (64, 4),
        (16, 4),
        (32, 8),
        (32, 8),
        (16, 4),
        (32, 4),
        (32, 4),
        (16, 16),
        (16, 4),
        (16, 4),
        (16, 16),
        (16, 4),
        (16, 4),
    ]
    # one hidden layer of at most 32 on a state of at most 16 columns: 128 on 4 (the contrastive kernel with IEEE
    # products 32 on 4); a wider state or a second layer is not that network (the rules above)
    assert [tc.static_launch_config(p, q, c) for c in (False, True) for p in ((16, 32), (16, 16)) for q in ("ieee", "tf32")] == [
        (128, 4)
    ] * 4 + [(32, 4), (128, 4)] * 2
    assert [tc.static_launch_config(p, "ieee", c) for c in (False, True) for p in ((32, 16), (16, 16, 16))] == [(16, 4)] * 4
    assert [tc.static_launch_config(p, "bf16", c) for c in (False, True) for p in ((32, 16), (16, 16, 16))] == [
        (64, 4),
        (64, 4),
        (32, 4),
        (32, 4),
    ]
    # input errors name the fix, before any kernel is compiled
    ok = program(lin(2, 8), torch.nn.SiLU(), lin(8, 1))
    x = torch.randn(5, 2)
    kw = dict(n_steps=2, step_size=0.1, noise_scale=0.1, seed=0, offset=0)
    for bad, match in (
        (dict(x=x[None]), "x must be \\(n_chains, d\\)"),
        (dict(x=x.double()), "x.float\\(\\)"),
        (dict(x=torch.randn(5, 3)), "the network takes 2 features, x has 3"),
        (dict(n_steps=-1), "n_steps must be >= 0"),
        (dict(block_n=24), "block_n must be a power of 2"),
        (dict(block_n=16.0), "block_n must be a power of 2"),
        (dict(num_warps=6), "num_warps must be 4, 8, 16 or None"),
        (dict(noise=torch.randn(2, 5, 3)), "noise must be \\(n_steps, n, d\\)"),
        (dict(out=torch.empty(5, 3)), "out must be \\(5, 2\\)"),
        (dict(step_size=torch.ones(4)), "step_size has 4 values for 5 chains"),
        (dict(network=program(lin(2, 8), torch.nn.GELU(), lin(8, 1))), "the kernel has no gelu"),
    ):
        args = {"x": x, "network": ok, **kw, **bad}
        noise = args.pop("noise", None)
        with pytest.raises(InputError, match=match):
            if noise is None:
                tc.feedforward_langevin_chain(args.pop("x"), args.pop("network"), **args)
            else:
                triton_chain_with_noise(args.pop("x"), args.pop("network"), noise, **args)
    assert tc.feedforward_langevin_chain(x, ok, **dict(kw, n_steps=0)).equal(x)  # nothing to launch
    # registered: explain lists it for CUDA inputs, with why it cannot run on this machine
    rows = {c.backend: c for c in ebmcore.explain("feedforward_langevin_chain", device="cuda", dtype=torch.bfloat16).candidates}
    assert "triton" in rows
    if torch.version.cuda is None:  # and deciding so imports no triton (in a fresh process: another test may have)
        code = (
            "import sys, torch, ebm_cuda.plugin, ebmcore\n"
            "ebmcore.explain('feedforward_langevin_chain', device='cuda', dtype=torch.float32)\n"
            "from ebm_cuda import triton_chains as tc\n"
            "print(tc.unavailable_reason())\n"
            "print('triton' in sys.modules)"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
        assert out[-2].startswith("this torch build has no CUDA") and out[-1] == "False"
    # where triton cannot be imported, the package still imports and the backend gives the reason
    code = (
        "import sys\nsys.modules['triton'] = None\n"
        "import ebm_cuda.backends\nfrom ebm_cuda import triton_chains as tc\nprint(tc._triton_reason())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[-1].startswith("triton is not importable (ModuleNotFoundError") and out[-1].endswith("pip install triton==3.7.1")


@pytest.mark.gpu
def test_on_a_gpu_the_compiled_chain_equals_the_host_build_and_samplers_resolve_it():
    """On a GPU machine (skipped without one; failed where a GPU is present but the Triton kernels cannot run): the
    compiled kernel against the host build on the same stream, for every activation and every depth, float32 (IEEE and TF32),
    bfloat16 states, bfloat16 products against their torch emulation, a ragged chain count, restarts; resolution picks
    it, a sampler runs it with ``fused=True``."""
    from ebm_cuda import triton_chains as tc
    from ebm_cuda.feedforward_ops import _langevin_chain_kernel as host_chain
    from ebm_cuda.testing import assert_chains_close, gpu_absent_reason
    from ebm_samplers import LangevinSampler
    from ebm_samplers.langevin import ULAChain

    absent = gpu_absent_reason()
    if absent is not None:
        pytest.skip(absent)
    reason = tc.unavailable_reason()
    if reason is not None:
        pytest.fail(
            f"a GPU is present ({torch.cuda.get_device_name()}) but the Triton kernels cannot run: {reason}", pytrace=False
        )
    x0 = torch.randn(3001, D, generator=torch.Generator().manual_seed(0))
    kw = dict(n_steps=20, step_size=0.02, noise_scale=0.2, seed=2**40 + 3, offset=5)
    # every activation at depth 2, every depth with SiLU; TF32 and bfloat16 state on two of them. Each case is a
    # kernel compiled on a bare machine (2-8 s): the full product (36 compiles) ran past the device check's time.
    cases = [(2, a, ("ieee",)) for a in ACTIVATIONS] + [
        (1, "SiLU", ("ieee",)),
        (3, "SiLU", ("ieee", "tf32", "bf16")),
        (2, "Tanh", ("tf32", "bf16")),
    ]
    for depth, activation, precisions in cases:
        program = feedforward_of(_network(depth, activation), -1.0 if depth == 2 else 1.0)
        expected = host_chain(x0, program, **kw)
        net = _network(depth, activation).cuda()
        cuda_program = feedforward_of(net, -1.0 if depth == 2 else 1.0)
        if "ieee" in precisions:
            got = tc.feedforward_langevin_chain(x0.cuda(), cuda_program, precision="ieee", **kw)
            assert_chains_close(got, expected, rtol=1e-4, atol=1e-4, what=f"{depth}-{activation} ieee")
        if "tf32" in precisions:
            tf32 = tc.feedforward_langevin_chain(x0.cuda(), cuda_program, precision="tf32", **kw)
            assert_chains_close(tf32, expected, rtol=5e-2, atol=5e-2, what=f"{depth}-{activation} tf32")
        if "bf16" in precisions:
            low = tc.feedforward_langevin_chain(x0.cuda().bfloat16(), cuda_program, precision="ieee", **kw)
            full = tc.feedforward_langevin_chain(x0.cuda().bfloat16().float(), cuda_program, precision="ieee", **kw)
            assert torch.equal(low, full.bfloat16())
    import copy

    # the smallest networks' configuration (128 chains on 4 warps: two tensor-core tiles' rows per warp), TF32
    tiny = torch.nn.Sequential(torch.nn.Linear(D, 32), torch.nn.SiLU(), torch.nn.Linear(32, 1))
    assert tc.static_launch_config((16, 32), "tf32") == (128, 4)
    got = tc.feedforward_langevin_chain(x0.cuda(), feedforward_of(copy.deepcopy(tiny).cuda()), precision="tf32", **kw)
    assert_chains_close(got, host_chain(x0, feedforward_of(tiny), **kw), rtol=5e-2, atol=5e-2, what="2-32-1 tf32")
    # bfloat16 products (the tensor cores' bfloat16 products): the one-step gradient against torch's rounding of every
    # operand, as under the interpreter
    net3, x1 = _network(3, "SiLU"), x0[:256]
    out = tc.feedforward_langevin_chain(
        x1.cuda(),
        feedforward_of(copy.deepcopy(net3).cuda(), -1.0),
        n_steps=1,
        step_size=1.0,
        noise_scale=0.0,
        seed=0,
        offset=0,
        precision="bf16",
    )
    got, emulated = (x1 - out.cpu()).double(), bf16_products_pass(net3, -1.0, x1)[0]
    scale = 1.0 + emulated.abs().max().item()
    assert ((got - emulated).abs() <= 1e-6 * scale).double().mean() >= 0.99, (got - emulated).abs().max()
    assert (got - emulated).abs().max() < 5e-4 * scale
    half = dict(kw, n_steps=10)
    first = tc.feedforward_langevin_chain(x0.cuda(), cuda_program, **half)
    both = tc.feedforward_langevin_chain(first, cuda_program, **dict(half, offset=15))
    assert torch.equal(both, tc.feedforward_langevin_chain(x0.cuda(), cuda_program, **kw))
    for dtype in (torch.float32, torch.bfloat16):
        assert ebmcore.explain("feedforward_langevin_chain", device="cuda", dtype=dtype).chosen.backend == "triton"
    # measured slower than the per-step loop on an H200: automatic sampling keeps the loop, fused=True runs the chain
    energy = ebmcore.SequentialEnergy(net)
    # automatic: the network chain is refused (it ranks below the loop), the per-step langevin_step_philox kernel runs
    from ebm_samplers.algorithm import fused_chain

    why = fused_chain("langevin_chain", energy, energy.program(), x0.cuda(), None)
    assert isinstance(why, str) and "ranks below the per-step loop" in why, why
    assert not isinstance(LangevinSampler(energy, step_size=0.01).prepare(x0.cuda(), None, {}).chain, ULAChain)
    run = LangevinSampler(energy, step_size=0.01, fused=True).prepare(x0.cuda(), None, {})
    assert run.path.startswith("fused chain") and isinstance(run.chain, ULAChain), run.path


if __name__ == "__main__":
    checks = {"interpreted": _interpreted_checks, "compile": _compile_checks}[sys.argv[1]]
    print(json.dumps(checks()))
