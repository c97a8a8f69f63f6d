"""The fused ops defined once (``ebmcore.kernels.ops.FUSED_OPS``): a kernel that does not take an op's parameters is
refused when its backend is built, and every registered backend's kernels take them."""

from __future__ import annotations

import pytest
import torch

from ebmcore import plugins
from ebmcore.kernels import Kernel, KernelBackend
from ebmcore.kernels.fused import FUSED_OPS, FusedOp, fused_op


def test_definitions_read_as_signatures():
    assert FUSED_OPS["feedforward_langevin_chain"].signature == (
        "(x: (n, d), network: ebmcore.energies.program.FeedForward, *, n_steps: int, step_size: float | (n,), "
        "noise_scale: float | (n,), seed: int, offset: int) -> x': (n, d)"
    )
    assert FUSED_OPS["<energy>_langevin_chain"].signature.startswith("(x: (n, d), *energy_args, n_steps: int, ")
    assert fused_op("gaussian_hmc_chain") is FUSED_OPS["<energy>_hmc_chain"]
    assert fused_op("feedforward_langevin_chain") is FUSED_OPS["feedforward_langevin_chain"]  # its own op, not an energy's
    assert fused_op("gaussian_energy") is None and fused_op("_langevin_chain") is None


def good_chain(x, *params, n_steps, step_size, noise_scale, seed, offset, block=16):  # a kernel's own option: allowed
    return x


@pytest.mark.parametrize(
    "fn, why",
    [
        (
            lambda x, params, n_steps, step_size, noise_scale, seed, offset: x,
            "takes n_steps, step_size, noise_scale, seed, offset positionally, where the energy's arguments go: make them "
            "keyword-only; lacks the keyword parameters n_steps, step_size, noise_scale, seed, offset",
        ),
        (lambda y, *params, n_steps, step_size, noise_scale, seed, offset: y, "positional parameters (y), the op's are (x)"),
        (
            lambda x, *, n_steps, step_size, noise_scale, seed, offset: x,
            "does not take the energy's arguments (as *args or parameters of their own)",
        ),
        (lambda x, *params, n_steps, step_size, seed, offset: x, "lacks the keyword parameters noise_scale"),
        (
            lambda x, *params, n_steps, step_size, noise_scale, seed, offset, temperature: x,
            "requires parameters the op does not pass: temperature",
        ),
    ],
)
def test_a_kernel_that_does_not_take_the_ops_parameters_is_refused_when_its_backend_is_built(fn, why):
    definition = FUSED_OPS["<energy>_langevin_chain"]
    assert definition.conformance(good_chain) is None
    assert definition.conformance(lambda x, *a, **kw: x) is None  # **kwargs takes every keyword
    # the energy's parameters by their own names, as `fn(x, mean, precision, n_steps=...)` calls it: fine
    assert definition.conformance(lambda x, mean, precision, *, n_steps, step_size, noise_scale, seed, offset: x) is None
    assert definition.conformance(fn) == why
    with pytest.raises(
        ValueError,
        match="backend 'mine': its kernel for op 'gaussian_langevin_chain' does not take the "
        r"op's parameters \(x: \(n, d\), \*energy_args, n_steps",
    ):
        KernelBackend("mine", [Kernel("gaussian_langevin_chain", fn, ("cpu",))])
    KernelBackend("mine", [Kernel("gaussian_langevin_chain", good_chain, ("cpu",))])


def test_a_plugins_own_op_is_checked_the_same_way():
    op = FusedOp("my_op", ("x: (n, d)", "v: (n, d)"), ("scale: float",), "(n,)")
    assert op.signature == "(x: (n, d), v: (n, d), *, scale: float) -> (n,)"
    assert op.conformance(lambda x, v, *, scale: x) is None
    assert op.conformance(lambda x, w, *, scale: x) == "positional parameters (x, w), the op's are (x, v)"
    assert op.conformance(lambda x, v, scale: x) is None  # without *args, a keyword may be positional-or-keyword
    assert op.conformance(lambda x, v, scale, extra: x) == "requires parameters the op does not pass: extra"
    assert op.conformance(lambda x, v: x) == "lacks the keyword parameters scale"


def test_every_registered_backend_takes_the_parameters_of_every_fused_op_it_implements():
    checked = 0
    for entry in plugins.session().table.entries("kernel"):
        for name, kernel in entry.component.kernels.items():
            definition = fused_op(name)
            if definition is not None:
                assert definition.conformance(kernel.fn) is None, (entry.component.name, name)
                checked += 1
    # the host and CUDA builds implement every analytic energy's three chains, the step and the network chains
    assert checked >= 2 * (3 * 4 + 1) + 2


def test_every_chain_op_but_nuts_has_a_reference_and_the_langevin_one_is_ula_on_the_given_stream():
    from ebmcore.kernels.fused import FUSED_OPS, langevin_chain_reference

    assert {name for name, op in FUSED_OPS.items() if op.reference is None} == {"<energy>_nuts_chain"}
    calls = []

    def normal(n, d, seed, step):  # a stand-in stream: the step number everywhere, and the calls recorded
        calls.append((n, d, seed, step))
        return torch.full((n, d), float(step))

    x = torch.randn(3, 2, 2, dtype=torch.float64)
    h = torch.tensor([0.1, 0.2, 0.3])
    out = langevin_chain_reference(lambda z: 2 * z, x, n_steps=2, step_size=h, noise_scale=0.5, seed=9, offset=4, normal=normal)
    expected = x
    for t in (4, 5):
        expected = expected - h.view(3, 1, 1).double() * 2 * expected + 0.5 * t
    torch.testing.assert_close(out, expected)
    assert calls == [(3, 4, 9, 4), (3, 4, 9, 5)]  # (n, elements per chain, seed, offset + t)
