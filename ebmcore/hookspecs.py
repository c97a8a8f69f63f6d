"""The map of the system: every hook an ebmcore plugin can implement.

A plugin is a module (or object) with functions marked ``@ebmcore.hookimpl``
and named like the specs below. It is found through the entry-point group
``ebmcore``::

    [project.entry-points.ebmcore]
    my_plugin = "my_package.plugin"

The core's own builtins (``ebmcore.builtin``, entry point ``builtin`` of the
``ebmcore`` distribution) register through exactly these hooks. Each
``ebm_register_*`` hook receives a :class:`ebmcore.registry.Registrar` bound to
the calling plugin, so every entry remembers which distribution and version
provided it. Registration hooks run once, lazily, the first time a component is
looked up -- never inside a sampling loop. pluggy calls each plugin's hooks for
that plugin alone, in the order the plugins load (so ordering markers such as
``tryfirst`` have nothing to order); name clashes are settled by the registry,
not by call order.

A hook implementation may take fewer arguments than its spec (pluggy's rule).
A plugin that defines an ``ebm_*`` hook unknown to this file (a typo such as
``ebm_register_sampler``) is rejected as a whole, with the known names in the
error. If a plugin's hook raises, that plugin's registrations from that hook are
discarded, the failure is recorded (``ebm plugins`` shows it) and quoted by
any lookup that finds nothing; other plugins are unaffected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ebmcore.components import Registrar

PROJECT_NAME = "ebmcore"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def ebm_register_energies(registry: "Registrar") -> None:
    """Register energy models by name.

    Called once per plugin, the first time any component is looked up.
    Call ``registry.register_energy(name, factory)`` where ``factory(**params)``
    returns an :class:`ebmcore.EnergyModel`. Return value is ignored.
    """


@hookspec
def ebm_register_samplers(registry: "Registrar") -> None:
    """Register samplers by name.

    Call ``registry.register_sampler(name, factory)`` where
    ``factory(energy, **params)`` returns an :class:`ebmcore.Sampler`.
    Return value is ignored.
    """


@hookspec
def ebm_register_integrators(registry: "Registrar") -> None:
    """Register integrators (SDE, ODE and Hamiltonian) by name.

    Call ``registry.register_integrator(name, factory)`` where ``factory(**params)``
    returns an :class:`ebmcore.Integrator` that declares its capabilities.
    Return value is ignored.
    """


@hookspec
def ebm_register_losses(registry: "Registrar") -> None:
    """Register training losses by name.

    Call ``registry.register_loss(name, factory)`` where ``factory(**params)``
    returns an :class:`ebmcore.Loss`. Return value is ignored.
    """


@hookspec
def ebm_register_ops(registry: "Registrar") -> None:
    """Register fused ops: what a kernel backend may implement for a family of computations on a type of energy
    program.

    Call ``registry.register_op(op)`` with an :class:`ebmcore.kernels.fused.FusedOp`: its ``family``
    (``"langevin_chain"``), the program type it runs (``ebmcore.energies.program.FeedForward``, ...) and its
    pure-torch ``reference``, whose signature is the op's. A kernel registered for the op is held to that
    signature when it is resolved. Return value is ignored.
    """


@hookspec
def ebm_register_kernels(registry: "Registrar") -> None:
    """Register a kernel backend and the op kernels it provides.

    Call ``registry.register_kernel_backend(backend)`` with an
    :class:`ebmcore.KernelBackend`; each of its :class:`ebmcore.Kernel` objects
    declares the op it implements, its device types, dtypes, minimum CUDA
    compute capability and priority. The resolver picks, per
    (op, device, dtype, capability), the highest-priority kernel that can run.
    A backend that cannot run on this machine still registers and reports why
    through ``KernelBackend.unavailable_reason()``. Return value is ignored.
    """


@hookspec
def ebm_add_commands(subparsers: Any) -> None:
    """Add subcommands to the ``ebm`` command line.

    Called once when ``ebm`` builds its parser, with the ``argparse``
    sub-parsers object: add a parser and ``set_defaults(func=run)`` where
    ``run(args) -> int`` is the exit status. ``ebm-samplers`` adds ``sample``
    and ``profile``, ``ebm-losses`` adds ``train``. A plugin whose hook raises
    is reported by ``ebm plugins``; the other commands still work.

    ``ebm --help`` lists the commands without calling this hook where every
    plugin declares them (name and one-line help) in the entry-point group
    ``ebmcore.commands``, and ``ebm COMMAND --help`` prints a command's help
    without it where the declaration's module also declares its arguments
    (``ARGUMENTS``, which this hook then applies too): see :mod:`ebmcore.commands`.
    """
