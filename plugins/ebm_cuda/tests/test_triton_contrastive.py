"""The Triton contrastive chain (``ebm_cuda.triton_chains.feedforward_contrastive_chain``) tested without a GPU, as
``test_triton_chains.py`` tests the chain it extends:

- Under Triton's interpreter, on CPU tensors at small sizes, in one child process started with ``TRITON_INTERPRET=1``
  (``python test_triton_contrastive.py interpreted``); each test asserts on what it measured: the states against the
  Triton Langevin chain's (to the bit), the energies, loss and every weight and bias gradient against the op's float64
  definition (``ebm_losses.ops.LOSS_OPS``) and against the host build on the same seed, block sizes, a ragged chain
  count, bfloat16 states, and contrastive divergence resolving it where the chain runs.
- Compiled for sm_80 and sm_90 with ``triton.compile`` in a second child process: registers and spills from ``ptxas -v``.

Skipped, saying so, where triton is not installed, but for the refusals and resolution.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.util
import json
import os
import sys
from typing import Any

import pytest
import torch

import ebmcore
from ebmcore.energies.program import feedforward_of
from ebm_cuda.testing import bf16_products_pass, run_triton_child

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install triton==3.7.1; make setup installs it)",
)

N = 37  # chains: not a multiple of any block size used
D = 3
WIDTHS = (D, 40, 17, 5)  # padded to 16-64-32-16
DEPTHS = {1: ("Tanh",), 2: ("SiLU", "Sigmoid"), 3: ("ReLU", "Tanh", "SiLU")}  # hidden activations per depth


def _network(depth: int, *, bias: bool = True, seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for i, activation in enumerate(DEPTHS[depth]):
        layers += [torch.nn.Linear(WIDTHS[i], WIDTHS[i + 1], bias=bias), getattr(torch.nn, activation)()]
    layers.append(torch.nn.Linear(WIDTHS[depth], 1, bias=bias))
    return torch.nn.Sequential(*layers)


def _flat(out: tuple[Any, ...]) -> list[Any]:
    """``(x', E(x), E(x'), loss, weight grads, bias grads)`` as one list."""
    return [*out[:4], *out[4], *out[5]]


def _relative(got: list[Any], expected: list[Any]) -> float:
    """The largest difference over the outputs, each relative to its own largest magnitude (None must match None)."""
    assert len(got) == len(expected)
    worst = 0.0
    for g, e in zip(got, expected):
        assert (g is None) == (e is None)
        if e is not None:
            worst = max(worst, ((g.double() - e.double()).abs().max() / e.double().abs().max().clamp_min(1e-3)).item())
    return worst


def _interpreted_checks() -> dict[str, Any]:
    """Everything measured under the interpreter (run in the child process; returns plain numbers)."""
    assert os.environ.get("TRITON_INTERPRET") == "1" and "triton" not in sys.modules
    from ebm_cuda import triton_chains as tc, triton_contrastive
    from ebm_cuda.backends import TritonBackend
    from ebm_cuda.triton_chains import TRITON_CHAIN_PRIORITY
    from ebm_cuda.contrastive_op import _contrastive_chain_kernel as host_contrastive
    from ebm_losses.ops import LOSS_OPS

    cd, chain = triton_contrastive.feedforward_contrastive_chain, tc.feedforward_langevin_chain
    results: dict[str, Any] = {}
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(N, D, generator=gen)
    a_vec, b_vec = torch.randn(N, generator=gen), torch.rand(N, generator=gen)
    kw = dict(n_steps=4, step_size=0.02, noise_scale=0.3, seed=2**33 + 7, offset=3)
    coefficients = {
        "vectors": ((a_vec, b_vec), (-a_vec, 0.5 * b_vec)),
        "scalars": ((1 / N, 0.2), (-1 / N, 0.2)),
        "b None": ((1 / N, None), (-1 / N, None)),
        "mixed": ((torch.tensor(0.5), None), (-a_vec, 0.1)),
    }
    # (name, depth, sign, bias, coefficients): every depth, both signs, layers without biases, every kind of (a, b)
    # the op under the function: torch.library's opcheck (schema, fake, dispatch)
    program = feedforward_of(_network(2), 1.0)
    tensors, padded, acts = tc.kernel_arguments(program, x0.device)
    a2, b2 = torch.randn(2, 5, generator=gen), torch.rand(2, 5, generator=gen)
    try:
        torch.library.opcheck(
            torch.ops.ebm_cuda.triton_contrastive_chain.default,
            (
                x0[:5],
                tensors,
                list(padded),
                list(acts),
                2,
                0.02,
                0.3,
                None,
                None,
                3,
                1,
                "ieee",
                16,
                8,
                a2,
                b2,
                torch.full((1,), 0.5),
            ),
        )
        results["opcheck"] = "ok"
    except Exception as exc:  # noqa: BLE001 - reported to the test
        results["opcheck"] = f"{type(exc).__name__}: {exc}"[:2000]
    cases = [
        ("1-vectors", 1, 1.0, True, "vectors"),
        ("2-scalars", 2, -1.0, True, "scalars"),
        ("3-b-none", 3, 1.0, True, "b None"),
        ("2-mixed-no-bias", 2, 1.0, False, "mixed"),
    ]
    states, definition, host = {}, {}, {}
    for name, depth, sign, bias, coef in cases:
        net = _network(depth, bias=bias)
        program = feedforward_of(net, sign)
        start, end = coefficients[coef]
        got = cd(x0, program, start=start, end=end, **kw)
        # the states: the Triton Langevin chain's, to the bit
        states[name] = (got[0] - chain(x0, program, **kw)).abs().max().item()
        # the op's definition in float64 (autograd), its moves made by the Triton chain
        twin = copy.deepcopy(net).double()
        reference = LOSS_OPS["feedforward_contrastive_chain"].reference(
            x0.double(),
            feedforward_of(twin, sign),
            chain=lambda y, _, **k: chain(y.float(), program, **k).double(),
            start=start,
            end=end,
            **kw,
        )
        definition[name] = _relative(_flat(got), _flat(reference))
        # the host build on the same seed: its noise equals this one to float32 rounding
        host[name] = _relative(_flat(got), _flat(host_contrastive(x0, program, start=start, end=end, **kw)))
    results.update(states=states, definition=definition, host=host)

    # per-chain step sizes and noise scales, one step
    program = feedforward_of(_network(2), 1.0)
    per_chain = dict(kw, n_steps=1, step_size=torch.linspace(0.01, 0.05, N), noise_scale=torch.linspace(0.1, 0.3, N))
    one = cd(x0, program, start=(a_vec, None), end=(-a_vec, b_vec), **per_chain)
    results["per_chain_states"] = (one[0] - chain(x0, program, **per_chain)).abs().max().item()

    # block sizes (the partial sums' slots change with them), and the same chains among more
    start, end = coefficients["vectors"]
    blocks = {b: cd(x0, program, start=start, end=end, block_n=b, **kw) for b in (16, 32, 64, 128)}
    results["block_states"] = max((blocks[b][0] - blocks[16][0]).abs().max().item() for b in blocks)
    results["block_outputs"] = max(_relative(_flat(blocks[b]), _flat(blocks[16])) for b in blocks)
    more = torch.cat([x0, torch.randn(11, D, generator=gen)])
    pad = torch.zeros(11)
    bigger = cd(
        more,
        program,
        start=(torch.cat([a_vec, pad]), torch.cat([b_vec, pad])),
        end=(torch.cat([-a_vec, pad]), torch.cat([0.5 * b_vec, pad])),
        **kw,
    )
    results["more_chains"] = max((bigger[i][:N] - blocks[16][i]).abs().max().item() for i in range(3))
    results["more_chains_gradients"] = _relative(_flat(bigger)[3:], _flat(blocks[16])[3:])

    # a block's padded rows take no part: here they would overflow (a ReLU net whose real chains sit still where every
    # unit is dead, a step of 1e38), and the gradient must stay the real chains' (finite; zero here)
    lin1, lin2 = torch.nn.Linear(2, 16), torch.nn.Linear(16, 1)
    with torch.no_grad():
        lin1.weight.zero_(), lin1.bias.fill_(-1.0), lin2.weight.zero_(), lin2.bias.zero_()
        lin1.weight[0, 0] = lin1.weight[1, 1] = 1.0
        lin1.bias[:2] = 1.0
        lin2.weight[0, :2] = -1.0
    dead = feedforward_of(torch.nn.Sequential(lin1, torch.nn.ReLU(), lin2), 1.0)
    padded = cd(
        torch.full((3, 2), -10.0),
        dead,
        n_steps=5,
        step_size=1e38,
        noise_scale=0.0,
        seed=1,
        offset=0,
        start=(1 / 3, None),
        end=(-1 / 3, None),
    )
    results["padded_rows_gradients"] = torch.cat([g.reshape(-1) for g in _flat(padded)[4:] if g is not None]).abs().max().item()
    results["padded_rows_loss"] = padded[3].item()

    # bfloat16 and float16 states: the chain's states, and the ends' energies at the states as stored
    for dtype in (torch.bfloat16, torch.float16):
        low = x0.to(dtype)
        got = cd(low, program, start=start, end=end, **kw)
        ref = chain(low, program, **kw)
        results[str(dtype).removeprefix("torch.")] = {
            "dtype": str(got[0].dtype),
            "states": (got[0].float() - ref.float()).abs().max().item(),
            "ends": (got[2] - cd(ref.float(), program, start=end, end=end, **dict(kw, n_steps=1))[1]).abs().max().item(),
        }
    # TF32 is accepted (the interpreter computes every product in float32 whatever it is asked)
    results["tf32_states"] = (
        (cd(x0, program, start=start, end=end, precision="tf32", **kw)[0] - chain(x0, program, precision="tf32", **kw))
        .abs()
        .max()
        .item()
    )
    # bfloat16 products: the chain's states to the bit, and the op's float64 definition (its moves the chain's) to
    # bfloat16 rounding
    got = cd(x0, program, start=start, end=end, precision="bf16", **kw)
    results["bf16_states"] = (got[0] - chain(x0, program, precision="bf16", **kw)).abs().max().item()
    net = _network(2)
    program = feedforward_of(net, 1.0)
    got = cd(x0, program, start=start, end=end, precision="bf16", **kw)
    reference = LOSS_OPS["feedforward_contrastive_chain"].reference(
        x0.double(),
        feedforward_of(copy.deepcopy(net).double(), 1.0),
        chain=lambda y, _, **k: chain(y.float(), program, precision="bf16", **k).double(),
        start=start,
        end=end,
        **kw,
    )
    ieee = cd(x0, program, start=start, end=end, **kw)
    # the weight-gradient products at both ends: with no move (h = s = 0) the ends are the starts, and each hidden
    # layer's gradient is the starts' and the ends' products of rounded (c·e_l)ᵀ and a_{l−1} (torch's rounding)
    c0, c1 = torch.randn(N, generator=gen), torch.randn(N, generator=gen)
    still = cd(x0, program, start=(c0, None), end=(c1, None), **dict(kw, step_size=0.0, noise_scale=0.0), precision="bf16")
    _, inputs, es = bf16_products_pass(net, 1.0, x0)

    def r(t: torch.Tensor) -> torch.Tensor:
        return t.float().bfloat16().double()

    close = count = 0
    worst = 0.0
    for layer, (a, e) in enumerate(zip(inputs, es)):
        emulated = sum(r(c.double()[:, None] * e).T @ r(a) for c in (c0, c1))
        got_w = still[4][layer].double()
        scale = emulated.abs().max().item()
        close += int(((got_w - emulated).abs() <= 1e-6 * scale).sum())
        count += got_w.numel()
        worst = max(worst, (got_w - emulated).abs().max().item() / scale)
    results["bf16_weight_products"] = {"close": close, "count": count, "worst": worst}
    results["bf16_definition"] = [_relative([g], [r]) for g, r in zip(_flat(got)[1:], _flat(reference)[1:])]
    results["ieee_definition"] = [_relative([g], [r]) for g, r in zip(_flat(ieee)[1:], _flat(reference)[1:])]

    # contrastive divergence resolves it where its sampler runs the Triton chain: both kernels registered for the CPU
    # (as the triton backend registers them for CUDA, the same priority), under the interpreter
    from ebmcore import KernelBackend, SequentialEnergy, hookimpl
    from ebmcore.testing import isolated_plugins
    from ebm_losses import ContrastiveDivergence
    from ebm_samplers import LangevinSampler

    calls = []

    @functools.wraps(triton_contrastive.feedforward_contrastive_chain)
    def recorded(*args, **kwargs):
        calls.append(fused)
        return triton_contrastive.feedforward_contrastive_chain(*args, **kwargs)

    kernels = [
        dataclasses.replace(
            k,
            fn=recorded if k.op == "feedforward_contrastive_chain" else k.fn,
            device_types=("cpu",),
            min_compute_capability=None,
        )
        for k in TritonBackend().kernels.values()
    ]
    assert all(k.priority == TRITON_CHAIN_PRIORITY for k in kernels)

    class Interpreted:
        @hookimpl
        def ebm_register_kernels(self, registry):
            registry.register_kernel_backend(KernelBackend("triton_interpreted", kernels))

    loss_runs = {}
    for fused in (True, None):
        net = _network(2)
        energy = SequentialEnergy(net)
        data = torch.randn(N, D, generator=torch.Generator().manual_seed(5))
        loss = ContrastiveDivergence(
            lambda e, fused=fused: LangevinSampler(e, step_size=0.01, fused=fused), 3, regularization=0.1
        )
        with isolated_plugins(("interpreted", Interpreted())):
            value = loss(energy, data, generator=torch.Generator().manual_seed(2))
            path = loss.sampler_for(energy).prepare(data, None, {}).path
            advanced = loss.sampler_for(energy).advance(data, 3, generator=torch.Generator().manual_seed(2))
        value.backward()
        twin = copy.deepcopy(net).double()
        for p in twin.parameters():
            p.grad = None
        e_pos, e_neg = twin(data.double()).squeeze(-1), twin(loss.last_negatives.double()).squeeze(-1)
        expected = e_pos.mean() - e_neg.mean() + 0.1 * (e_pos.square().mean() + e_neg.square().mean())
        expected.backward()
        loss_runs[str(fused)] = {
            "path": path,
            "negatives_are_advance": bool(torch.equal(loss.last_negatives, advanced)),
            "loss": abs(value.item() - expected.item()) / abs(expected.item()),
            "gradients": _relative([p.grad for p in net.parameters()], [p.grad for p in twin.parameters()]),
        }
    results["loss"] = loss_runs
    results["contrastive_calls"] = calls
    return results


def _compile_checks() -> dict[str, Any]:
    """Registers and spills of the contrastive kernel compiled for sm_80 and sm_90 (child process, no interpreter)."""
    assert "TRITON_INTERPRET" not in os.environ
    from ebm_cuda.kernel_report import compile_report

    configs = {
        "2-64-64-1 silu float32 ieee": dict(widths=(2, 64, 64)),  # 16 chains on 4 warps (launch_config)
        "64-64-64-64-1 silu float32 ieee": dict(widths=(64, 64, 64, 64)),  # 16 on 16
        "64-64-1 silu float32 ieee": dict(widths=(64, 64)),
    }  # 16 on 16: on 4 it spilled 1.8 KB
    reports = {f"sm_{cc} {name}": compile_report(cc, contrastive=True, **kw) for cc in (80, 90) for name, kw in configs.items()}
    reports["sm_90 3-40-17-5-1 tanh/sigmoid/relu bfloat16 ieee, b None, per-chain h and s"] = compile_report(
        90, widths=WIDTHS, activations=(1, 2, 3), dtype=torch.bfloat16, per_chain=True, contrastive=True, has_b=False
    )
    reports["sm_90 2-64-64-1 silu float32 tf32"] = compile_report(90, widths=(2, 64, 64), precision="tf32", contrastive=True)
    reports["sm_90 2-64-64-1 silu float32 bf16"] = compile_report(90, widths=(2, 64, 64), precision="bf16", contrastive=True)
    # the configuration launch_config replaced: 16 chains on 8 warps
    reports["sm_90 2-64-64-1 silu float32 tf32, 16 chains on 8 warps"] = compile_report(
        90, widths=(2, 64, 64), precision="tf32", contrastive=True, block_n=16, num_warps=8
    )
    return reports


def _child(what: str, interpret: bool, cache: str | None = None) -> dict[str, Any]:
    return run_triton_child(__file__, what, interpret, cache)


@pytest.fixture(scope="module")
def interpreted() -> dict[str, Any]:
    return _child("interpreted", interpret=True)


@needs_triton
def test_the_states_are_the_triton_chains_to_the_bit(interpreted):
    assert len(interpreted["states"]) == 4
    assert all(v == 0.0 for v in interpreted["states"].values()), interpreted["states"]
    assert interpreted["per_chain_states"] == 0.0


@needs_triton
def test_energies_loss_and_every_gradient_equal_the_ops_definition_in_float64(interpreted):
    # every output relative to its largest magnitude: float32 passes and sums against float64 autograd. The largest
    # (5.6e-6, the last hidden bias of the 3-layer network) is a gradient in which the starts' and the ends' sums
    # nearly cancel (a = ±1/n): 1e-8 absolute; the states, energies and loss are within 1e-7
    assert max(interpreted["definition"].values()) < 2e-5, interpreted["definition"]


@needs_triton
def test_the_outputs_equal_the_host_builds_on_the_same_seed(interpreted):
    # the two noise streams agree to float32 rounding only: after 4 steps the states, energies and gradients agree to
    # 1.2e-5 (the same cancelling bias gradient; 1e-6 elsewhere)
    assert max(interpreted["host"].values()) < 5e-5, interpreted["host"]


@needs_triton
def test_block_size_and_chain_count_do_not_change_the_results(interpreted):
    assert interpreted["block_states"] < 1e-6  # the interpreter's products differ in the last bit with the block's rows
    assert interpreted["block_outputs"] < 1e-5  # and the partial sums are added in other groups (1.8e-6)
    assert interpreted["more_chains"] == 0.0  # 37 chains among 48: the same states and energies
    assert interpreted["more_chains_gradients"] < 1e-6  # the added chains have zero coefficients


@needs_triton
def test_a_blocks_padded_rows_take_no_part_in_the_gradient(interpreted):
    assert interpreted["padded_rows_gradients"] == 0.0  # not NaN: the real chains' gradient
    assert interpreted["padded_rows_loss"] == 0.0


@needs_triton
def test_the_op_passes_opcheck(interpreted):
    assert interpreted["opcheck"] == "ok"


@needs_triton
def test_bfloat16_and_float16_states_and_the_ends_energies_at_the_stored_states(interpreted):
    for name in ("bfloat16", "float16"):
        assert interpreted[name] == {"dtype": f"torch.{name}", "states": 0.0, "ends": 0.0}
    assert interpreted["tf32_states"] == 0.0


@needs_triton
def test_bfloat16_products_agree_with_the_definition_to_bfloat16_rounding(interpreted):
    assert interpreted["bf16_states"] == 0.0
    # against the float64 definition at the same states, each output relative to its largest magnitude: the energies
    # of bfloat16 products (8 significant bits, 2^-9 = 2e-3 per rounding) to a few roundings (2.5e-3 and 3.2e-3), the
    # loss and the gradients, differences of the starts' and the ends' sums, to a few roundings amplified by that
    # cancellation (8e-4 to 3.7e-2); IEEE products' to 1.5e-5, so the rounding measured is the products'
    bf16, ieee = interpreted["bf16_definition"], interpreted["ieee_definition"]
    assert max(bf16[:2]) < 1e-2 and max(bf16[2:]) < 1e-1, bf16
    assert min(bf16) > 1e-4 > max(ieee), (bf16, ieee)
    # the weight-gradient products themselves against torch's rounding of both operands: nearly every element to 1e-6
    # (an operand may round the other way where the kernel's float32 pass and torch's float64 one differ)
    w = interpreted["bf16_weight_products"]
    assert w["close"] >= 0.99 * w["count"] and w["worst"] < 5e-3, w


@needs_triton
def test_contrastive_divergence_runs_it_where_its_sampler_runs_the_triton_chain(interpreted):
    fused, automatic = interpreted["loss"]["True"], interpreted["loss"]["None"]
    assert interpreted["contrastive_calls"] == [True]  # fused=True: one call; automatic: the chain ranks below the loop
    assert fused["path"].startswith("fused chain") and not automatic["path"].startswith("fused chain")
    for run in (fused, automatic):
        assert run["negatives_are_advance"]
        # float32 against float64, relative: the loss is a difference of means (4.7e-6 fused, 1.7e-5 by autograd)
        assert run["loss"] < 1e-4
        assert run["gradients"] < 1e-4


@needs_triton
def test_the_contrastive_kernel_compiles_for_sm80_and_sm90_within_its_spill_and_instruction_bounds(tmp_path):
    reports = _child("compile", interpret=False, cache=str(tmp_path))
    for name, report in reports.items():  # in the test's output (pytest -s, or -rA)
        print(
            f"{name}: {report['registers']} registers, {report['spill_stores']} bytes spill stores, "
            f"{report['spill_loads']} bytes spill loads, {report['shared']} bytes shared, {report['seconds']:.1f} s, "
            f"{report['block_n']} chains on {report['num_warps']} warps, {report['per_chain_step']} warp-instructions "
            f"per chain-step"
        )
    assert len(reports) == 10
    assert all(0 < r["registers"] <= 255 for r in reports.values())
    # no spills (the ragged 3-40-17-5-1 network with bfloat16 states, no b, IEEE, sm_90, spilled 8 bytes before the
    # activations' exponentials and reciprocals were one instruction each); recorded above
    assert not [name for name, r in reports.items() if r["spill_stores"] or r["spill_loads"]]
    # the step loop's cost (warp-instructions per chain-step, the passes at the ends counted as if every pass made
    # them): 32 chains on 4 warps against the 16 on 8 it replaced, TF32, sm_90: 168 against 372 (204 against 404
    # before the activations' exponentials and reciprocals were one instruction each)
    cost = {name: r["per_chain_step"] for name, r in reports.items()}
    assert all(c is not None and c > 0 for c in cost.values()), cost
    tf32 = cost["sm_90 2-64-64-1 silu float32 tf32"]
    assert tf32 * 2 < cost["sm_90 2-64-64-1 silu float32 tf32, 16 chains on 8 warps"], cost
    for name, count in (
        ("sm_90 2-64-64-1 silu float32 tf32", 168),
        ("sm_90 2-64-64-1 silu float32 ieee", 785),
        ("sm_90 2-64-64-1 silu float32 tf32, 16 chains on 8 warps", 372),
        # 146 before the layer gradients' bfloat16 tl.dot became TF32 products of rounded operands (the sm_90 crash,
        # ebm_cuda.triton_launch.CONTRASTIVE_BF16): the rounding and the TF32 products of the two passes that take them
        ("sm_90 2-64-64-1 silu float32 bf16", 203),
        ("sm_90 64-64-64-64-1 silu float32 ieee", 2287),
    ):
        assert 0.85 * count < cost[name] < 1.15 * count, (name, cost[name])  # the counts when chosen, within 15 %


def test_refusals_input_errors_and_resolution_name_their_reason():
    from ebm_cuda import triton_chains as tc, triton_contrastive
    from ebm_cuda.backends import TritonBackend
    from ebm_cuda.triton_chains import TRITON_CHAIN_PRIORITY
    from ebmcore.errors import InputError

    lin = torch.nn.Linear
    kernel = TritonBackend().kernels["feedforward_contrastive_chain"]
    assert kernel.priority == TRITON_CHAIN_PRIORITY and kernel.device_types == ("cuda",) and kernel.dtypes == tc.DTYPES
    gelu = feedforward_of(torch.nn.Sequential(lin(2, 8), torch.nn.GELU(), lin(8, 1)))
    assert kernel.refuses(gelu) == "has no gelu (it takes silu, tanh, sigmoid, relu, leaky_relu, elu)"
    wide = feedforward_of(torch.nn.Sequential(lin(2, 65), torch.nn.SiLU(), lin(65, 1)))
    assert kernel.refuses(wide) == "takes layers at most 64 wide, the network has one 65 wide"
    ok = feedforward_of(torch.nn.Sequential(lin(2, 8), torch.nn.SiLU(), lin(8, 1)))
    x = torch.randn(5, 2)
    kw = dict(n_steps=2, step_size=0.1, noise_scale=0.1, seed=0, offset=0, start=(1.0, None), end=(-1.0, None))
    for bad, match in (
        (dict(network=gelu), "feedforward_contrastive_chain: the kernel has no gelu"),
        (dict(n_steps=0), "n_steps must be >= 1"),
        (dict(x=x.double()), "x.float\\(\\)"),
        (dict(block_n=8), "block_n must be a power of 2"),
        (dict(start=(1.0,)), "start must be a pair"),
        (dict(end=(None, 1.0)), "end\\[0\\] \\(a\\) must be a number"),
        (dict(start=(torch.ones(4), None)), "start\\[0\\] has 4 values for 5 chains"),
    ):
        args = {"x": x, "network": ok, **kw, **bad}
        with pytest.raises(InputError, match=match):
            triton_contrastive.feedforward_contrastive_chain(args.pop("x"), args.pop("network"), **args)
    # no chains: nothing to launch (and no triton imported), zero gradients of the layers' shapes
    empty = triton_contrastive.feedforward_contrastive_chain(x[:0], ok, **kw)
    assert empty[0].shape == (0, 2) and empty[1].shape == empty[2].shape == (0,) and empty[3].item() == 0.0
    assert [tuple(g.shape) for g in empty[4]] == [(8, 2), (1, 8)] and all(not g.any() for g in empty[4] + empty[5])
    # the losses' definition of the op takes it (checked when contrastive divergence first resolves it)
    from ebm_losses.ops import LOSS_OPS

    assert LOSS_OPS["feedforward_contrastive_chain"].conformance(triton_contrastive.feedforward_contrastive_chain) is None
    rows = {c.backend: c for c in ebmcore.explain("feedforward_contrastive_chain", device="cuda", dtype=torch.float32).candidates}
    assert rows["triton"].priority == TRITON_CHAIN_PRIORITY
    if torch.version.cuda is None:
        assert rows["triton"].reason.startswith("cannot run: this torch build has no CUDA")


@pytest.mark.gpu
def test_on_a_gpu_the_compiled_contrastive_chain_equals_the_chain_and_the_host_build():
    """On a GPU machine (skipped without one; failed where a GPU is present but the Triton kernels cannot run): the
    compiled contrastive kernel's states against the compiled chain's (to the bit), its outputs against the host
    build's on the same stream, and contrastive divergence running it with ``fused=True``."""
    from ebm_cuda import triton_chains as tc, triton_contrastive
    from ebm_cuda.contrastive_op import _contrastive_chain_kernel as host_contrastive
    from ebm_cuda.testing import gpu_absent_reason
    from ebm_losses import ContrastiveDivergence
    from ebm_samplers import LangevinSampler

    absent = gpu_absent_reason()
    if absent is not None:
        pytest.skip(absent)
    reason = tc.unavailable_reason()
    if reason is not None:
        pytest.fail(
            f"a GPU is present ({torch.cuda.get_device_name()}) but the Triton kernels cannot run: {reason}", pytrace=False
        )
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(3001, D, generator=gen)
    a, b = torch.randn(3001, generator=gen), torch.rand(3001, generator=gen)
    kw = dict(n_steps=20, step_size=0.02, noise_scale=0.2, seed=2**40 + 3, offset=5, start=(a, b), end=(-a, None))
    for depth, sign in ((2, -1.0), (3, 1.0)):
        net = _network(depth)
        host = host_contrastive(x0, feedforward_of(net, sign), **kw)
        program = feedforward_of(copy.deepcopy(net).cuda(), sign)
        cuda_kw = dict(kw, start=(a.cuda(), b.cuda()), end=(-a.cuda(), None))
        got = triton_contrastive.feedforward_contrastive_chain(x0.cuda(), program, precision="ieee", **cuda_kw)
        chain_kw = {k: v for k, v in kw.items() if k not in ("start", "end")}
        assert torch.equal(got[0], tc.feedforward_langevin_chain(x0.cuda(), program, precision="ieee", **chain_kw))
        assert _relative([t.cpu() if t is not None else None for t in _flat(got)], _flat(host)) < 1e-3  # 20 steps, float32 noise
    # bfloat16 products, compiled (the CPU tests run them as "bf16-emulated" under the interpreter), on W5's network
    # (2-64-64-1 SiLU) at the launch configurations group T times: on an H100 (Triton 3.6.0) every launch failed with
    # an illegal memory access. Each launch synchronised, so that a fault names its configuration; the moves are the
    # bfloat16 chain's at the same configuration, and the loss and gradients finite.
    torch.manual_seed(1)
    w5 = torch.nn.Sequential(
        torch.nn.Linear(2, 64), torch.nn.SiLU(), torch.nn.Linear(64, 64), torch.nn.SiLU(), torch.nn.Linear(64, 1)
    ).cuda()
    program, x2 = feedforward_of(w5, 1.0), torch.randn(3001, 2, generator=gen).cuda()
    for block_n, warps in ((64, 4), (32, 4), (16, 8), (128, 8)):
        config = dict(precision="bf16", block_n=block_n, num_warps=warps)
        got = triton_contrastive.feedforward_contrastive_chain(x2, program, **config, **cuda_kw)
        torch.cuda.synchronize()
        assert torch.equal(got[0], tc.feedforward_langevin_chain(x2, program, **config, **chain_kw)), config
        assert all(torch.isfinite(t).all() for t in _flat(got) if t is not None), config
    energy = ebmcore.SequentialEnergy(_network(2).cuda())
    data = torch.randn(512, D, device="cuda")
    loss = ContrastiveDivergence(lambda e: LangevinSampler(e, step_size=0.01, fused=True), 5)
    value = loss(energy, data)
    assert "GivenGradients" in type(value.grad_fn).__name__, value.grad_fn


if __name__ == "__main__":
    checks = {"interpreted": _interpreted_checks, "compile": _compile_checks}[sys.argv[1]]
    print(json.dumps(checks()))
