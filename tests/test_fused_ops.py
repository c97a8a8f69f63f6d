"""The fused ops, each defined once by its reference (``ebmcore.kernels.fused``) and registered through
``ebm_register_ops``: a kernel that does not take an op's parameters is refused when it is resolved, and every
registered backend's kernels take them."""

from __future__ import annotations

import pytest
import torch

import ebmcore
from ebmcore import plugins
from ebmcore.energies.program import Analytic, ConvStack, FeedForward
from ebmcore.errors import PluginError
from ebmcore.kernels import Kernel, KernelBackend
from ebmcore.kernels.fused import BUILTIN_FUSED_OPS, FusedOp, langevin_chain_reference, op_of_kernel
from ebmcore.kernels.resolve import fused_op, fused_ops


def _op(family: str, program: type | None) -> FusedOp:
    return next(op for op in BUILTIN_FUSED_OPS if op.key == (family, program))


def test_ops_are_keyed_by_family_and_program_type_and_read_as_their_references_signature():
    network = _op("langevin_chain", FeedForward)
    assert network.name == "feedforward.langevin_chain" and network.kernel_name() == "feedforward_langevin_chain"
    assert network.signature == (
        "(x: Tensor, network: FeedForward, *, n_steps: int, step_size: float | Tensor, noise_scale: float | Tensor, "
        "seed: int, offset: int) -> Tensor"
    )  # the reference's own keywords (normal, gradient) are not the op's
    analytic = _op("langevin_chain", Analytic)
    assert analytic.signature.startswith("(x: Tensor, *energy_args: Any, n_steps: int, ")
    assert analytic.kernel_name(Analytic("gaussian", ())) == "gaussian_langevin_chain"
    assert op_of_kernel("gaussian_hmc_chain", BUILTIN_FUSED_OPS) is _op("hmc_chain", Analytic)
    assert op_of_kernel("feedforward_langevin_chain", BUILTIN_FUSED_OPS) is network  # its own op, not an energy's
    assert op_of_kernel("gaussian_energy", BUILTIN_FUSED_OPS) is None
    assert op_of_kernel("_langevin_chain", BUILTIN_FUSED_OPS) is None
    # the session holds what the plugins registered: the core's ops and the losses' (ebm-losses is installed)
    assert fused_op("langevin_chain", ConvStack) is _op("langevin_chain", ConvStack)
    assert fused_op("contrastive_chain", FeedForward).kernel_name() == "feedforward_contrastive_chain"
    assert {op.name for op in fused_ops()} >= {op.name for op in BUILTIN_FUSED_OPS}
    assert "feedforward.langevin_chain" in ebmcore.registry.names("op")


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
        (lambda y, *params, n_steps, step_size, noise_scale, seed, offset: y, "has positional parameters (y), the op's are (x)"),
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
def test_a_kernel_that_does_not_take_the_ops_parameters_is_refused_when_it_is_resolved(fn, why):
    definition = _op("langevin_chain", Analytic)
    assert definition.conformance(good_chain) is None
    assert definition.conformance(lambda x, *a, **kw: x) is None  # **kwargs takes every keyword
    # the energy's parameters by their own names, as `fn(x, mean, precision, n_steps=...)` calls it: fine
    assert definition.conformance(lambda x, mean, precision, *, n_steps, step_size, noise_scale, seed, offset: x) is None
    assert definition.conformance(fn) == why

    class Mine:
        @ebmcore.hookimpl
        def ebm_register_kernels(self, registry):
            registry.register_kernel_backend(
                KernelBackend("mine", [Kernel("gaussian_langevin_chain", fn, ("cpu",), priority=50)])
            )

    ebmcore.register_plugin(Mine(), "mine")
    with pytest.raises(
        PluginError,
        match="backend 'mine': its kernel for op 'gaussian_langevin_chain' .* does not take the "
        r"op's parameters \(x: Tensor, \*energy_args: Any, n_steps",
    ):
        ebmcore.kernels.resolve_kernel("gaussian_langevin_chain", torch.device("cpu"), torch.float64)


def test_a_plugins_own_op_is_registered_and_checked_the_same_way():
    def my_reference(x, v, *, scale: float, normal=None):
        """``x: (n, d), v: (n, d) -> (n,)``; reference only: ``normal``."""
        return (x * v).sum(-1) * scale

    op = FusedOp("my_op", FeedForward, my_reference)
    assert op.signature == "(x, v, *, scale: float)"
    assert op.conformance(lambda x, v, *, scale: x) is None
    assert op.conformance(lambda x, w, *, scale: x) == "has positional parameters (x, w), the op's are (x, v)"
    assert op.conformance(lambda x, v, scale: x) is None  # without *args, a keyword may be positional-or-keyword
    assert op.conformance(lambda x, v, scale, extra: x) == "requires parameters the op does not pass: extra"
    assert op.conformance(lambda x, v: x) == "lacks the keyword parameters scale"

    class Third:
        @ebmcore.hookimpl
        def ebm_register_ops(self, registry):
            registry.register_op(op)

        @ebmcore.hookimpl
        def ebm_register_kernels(self, registry):
            registry.register_kernel_backend(KernelBackend("third", [Kernel("feedforward_my_op", lambda x, w, *, scale: x)]))

    ebmcore.register_plugin(Third(), "third")
    assert fused_op("my_op", FeedForward) is op
    with pytest.raises(PluginError, match=r"feedforward_my_op.*has positional parameters \(x, w\), the op's are \(x, v\)"):
        ebmcore.kernels.resolve_kernel("feedforward_my_op", torch.device("cpu"), torch.float32)


def test_every_registered_backend_takes_the_parameters_of_every_fused_op_it_implements():
    checked = 0
    ops = fused_ops()
    for entry in plugins.session().table.entries("kernel"):
        for name, kernel in entry.component.kernels.items():
            definition = op_of_kernel(name, ops)
            if definition is not None:
                assert definition.conformance(kernel.fn) is None, (entry.component.name, name)
                checked += 1
    # the host and CUDA builds implement every analytic energy's three chains, the step and the network chains
    assert checked >= 2 * (3 * 4 + 1) + 2


def test_every_chain_op_but_nuts_has_a_reference_and_the_langevin_one_is_ula_on_the_given_stream():
    assert {op.name for op in BUILTIN_FUSED_OPS if not op.runs} == {"analytic.nuts_chain"}
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
    # the analytic op's reference is the same chain, called as the op is
    same = _op("langevin_chain", Analytic).reference(
        x,
        "any energy arguments",
        n_steps=2,
        step_size=h,
        noise_scale=0.5,
        seed=9,
        offset=4,
        gradient=lambda z: 2 * z,
        normal=normal,
    )
    torch.testing.assert_close(same, expected)
