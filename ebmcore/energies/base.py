"""The energy model base class: ``E(x)``, its gradient ``∇ₓE`` and score ``−∇ₓE``."""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor, nn

from ebmcore.energies import feedforward
from ebmcore.energies.program import Analytic, FeedForward, Opaque, Program
from ebmcore.errors import InputError
from ebmcore.validation import check_batch, check_energy_output, check_finite, check_gradient_output

__all__ = ["EnergyModel", "EnergyFunctions", "uses_autograd", "closed_form_program"]


def autocast_enabled(device_type: str) -> bool:
    """Whether ``torch.autocast`` is on for ``device_type`` here (closed forms then step aside)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 takes no device type
        return torch.is_autocast_enabled() if device_type == "cuda" else torch.is_autocast_cpu_enabled()


def uses_autograd(energy: "EnergyModel") -> bool:
    """True when ``energy`` overrides neither ``compute_gradient`` nor ``compute_energy_and_gradient``."""
    cls = type(energy)
    return (
        cls.compute_gradient is EnergyModel.compute_gradient
        and cls.compute_energy_and_gradient is EnergyModel.compute_energy_and_gradient
    )


def closed_form_program(energy: "EnergyModel", like: Tensor) -> tuple[Optional[FeedForward], str]:
    """``(program, "")`` when ``energy`` leaves its gradient to autograd and its program is a feed-forward network
    that takes inputs like ``like: (n, d)`` (:func:`ebmcore.energies.feedforward.closed_form`); else ``(None, why)``."""
    if not uses_autograd(energy):
        return None, f"{type(energy).__name__} computes its own gradient"
    return feedforward.closed_form(energy.program(), like)


def _no_graph(owner: str, what: str) -> str:
    return (
        f"{owner}.compute_energy(x) {what}, so its gradient cannot be taken: it computes the energy from "
        "x.detach(), under torch.no_grad(), through NumPy or .item(), or not from x at all. Compute it from x "
        "with torch operations, or override compute_gradient(x, create_graph=False) to return ∇ₓE yourself "
        "(torch.zeros_like(x) for an energy that does not depend on x)."
    )


def mismatched_parameter(module: nn.Module) -> Optional[str]:
    """Where a floating parameter of ``module`` differs in dtype or device from its first one (None: none does), in
    words naming the layer and the fix: torch's "mat1 and mat2 must have the same dtype" names neither."""
    first: Optional[tuple[str, Tensor]] = None
    for name, t in module.named_parameters():
        if not t.is_floating_point():
            continue
        if first is None:
            first = (name, t)
        elif t.dtype != first[1].dtype or t.device != first[1].device:
            layer = name.rpartition(".")[0]
            owner = f"layer {layer!r} ({type(module.get_submodule(layer)).__name__})" if layer else "the model"
            return (
                f"{type(module).__name__}: {owner} holds parameter {name!r} in {t.dtype} on {t.device}, but "
                f"{first[0]!r} is {first[1].dtype} on {first[1].device}; give every layer one dtype and device: "
                f"model.to({first[1].dtype}) (or model.to(device)) after building it. (ebmcore never casts silently.)"
            )
    return None


def _tree_reference(module: nn.Module) -> tuple[Optional[Tensor], bool]:
    """A floating parameter of ``module``'s tree (None: none) and whether every floating parameter shares its dtype
    and device, in one walk of the modules' own dictionaries (``named_parameters()`` builds every name; this runs on
    each checked call). When they all agree, which one is returned does not matter: only its dtype and device are
    read; when they do not, :func:`mismatched_parameter` names the layer."""
    first: Optional[Tensor] = None
    seen: set[int] = set()
    todo = [module]
    while todo:
        m = todo.pop()
        if id(m) in seen:  # a module shared by two parents (or a cycle): once, as named_modules() does
            continue
        seen.add(id(m))
        for t in m._parameters.values():
            if t is None or not t.is_floating_point():
                continue
            if first is None:
                first = t
            elif t.dtype != first.dtype or t.device != first.device:
                return first, False
        todo.extend(c for c in m._modules.values() if c is not None)
    return first, True


def _leaf_reference(module: nn.Module) -> Optional[Tensor]:
    """:meth:`EnergyModel._reference_tensor` of a module without submodules, read from its own dictionaries."""
    for t in module._parameters.values():
        if t is not None and t.is_floating_point():
            return t
    for t in module._buffers.values():
        if t is not None and t.is_floating_point():
            return t
    return None


class EnergyFunctions(NamedTuple):
    """Unchecked callables for a hot loop, with any kernel choice already made (see ``EnergyModel.bind``)."""

    energy: Callable[[Tensor], Tensor]
    gradient: Callable[[Tensor], Tensor]
    energy_and_gradient: Callable[[Tensor], tuple[Tensor, Tensor]]
    path: str = ""  # how the gradient is computed, for reports ("" when nothing to say)
    program: Optional[Program] = None  # what the energy computes, for kernels that run it themselves (None: not read)


class EnergyModel(nn.Module):
    """An energy ``E(x)`` over inputs ``x: (n, *event_shape)``; the density is ``p(x) ∝ exp(-E(x))``.

    Subclasses implement :meth:`compute_energy` and, where known, an analytic
    :meth:`compute_gradient`; the default gradient uses autograd. Set
    ``event_shape`` (a tuple) to have inputs checked against it.

    The public methods (:meth:`energy`, :meth:`gradient`, :meth:`score`,
    :meth:`energy_and_gradient`, ``forward``) check the input's shape, dtype and
    device (never casting) and that the result is finite (one host sync).
    The ``compute_*`` methods are the unchecked hot-loop path: samplers check
    their initial state once, then call these with no validation and no sync.
    """

    event_shape: tuple[int, ...] | None = None

    # -- to implement ------------------------------------------------------------------------

    def compute_energy(self, x: Tensor) -> Tensor:
        """Unchecked ``E(x)``: ``x: (n, *event_shape)`` -> ``(n,)``."""
        raise NotImplementedError(f"{type(self).__name__} must implement compute_energy(x) -> (n,)")

    def compute_gradient(self, x: Tensor, create_graph: bool = False) -> Tensor:
        """Unchecked ``∇ₓE(x)``: same shape as ``x``. Autograd unless overridden."""
        return self.compute_energy_and_gradient(x, create_graph)[1]

    def compute_energy_and_gradient(self, x: Tensor, create_graph: bool = False) -> tuple[Tensor, Tensor]:
        """Unchecked ``(E(x), ∇ₓE(x))`` in one pass.

        With ``create_graph=True`` both stay differentiable (for score
        matching and gradient penalties); otherwise both are detached.
        """
        if type(self).compute_gradient is not EnergyModel.compute_gradient:
            # An analytic gradient exists: use it rather than autograd.
            energy = self.compute_energy(x)
            grad = self.compute_gradient(x, create_graph)
            if not (isinstance(energy, Tensor) and isinstance(grad, Tensor)):  # .detach() would not name them
                check_energy_output(energy, x, owner=type(self).__name__)
                check_gradient_output(grad, x, owner=type(self).__name__)
            return (energy, grad) if create_graph else (energy.detach(), grad.detach())
        with torch.enable_grad():
            xg = x if (create_graph and x.requires_grad) else x.detach().requires_grad_(True)
            energy = self.compute_energy(xg)
            if not (isinstance(energy, Tensor) and energy.is_floating_point()):  # autograd's error would not name it
                check_energy_output(energy, x, owner=type(self).__name__)
            if not energy.requires_grad:  # autograd's error would name neither compute_energy nor the fix
                raise InputError(_no_graph(type(self).__name__, "has no autograd graph"))
            (grad,) = torch.autograd.grad(energy.sum(), xg, create_graph=create_graph, allow_unused=True)
            if grad is None:  # a graph through the parameters only
                raise InputError(_no_graph(type(self).__name__, "does not depend on x through autograd"))
        return (energy, grad) if create_graph else (energy.detach(), grad)

    def program(self) -> Program:
        """What this energy computes, as a typed program (:mod:`ebmcore.energies.program`), read from its structure
        each time it is asked for: closed forms and native kernels run it. By default :class:`Opaque`: ebm does not
        read Python code, so a hand-written ``compute_energy`` is differentiated by autograd. Energies whose structure
        says what they compute declare it (:class:`~ebmcore.energies.SequentialEnergy`, ``MLPEnergy``, analytic
        energies, ``ConvEnergy``); an override must compute exactly what ``compute_energy`` does
        (``ebmcore.testing.check_program`` checks it)."""
        return Opaque(
            f"{type(self).__name__}.compute_energy is Python code that ebm does not read; wrap an "
            "nn.Sequential in ebmcore.SequentialEnergy (or use MLPEnergy) for the closed form and kernels"
        )

    def bind(self, like: Tensor) -> EnergyFunctions:
        """Unchecked ``(energy, gradient, energy_and_gradient)`` callables for inputs like ``like``, with the energy's
        :meth:`program`.

        Samplers call this once before their loop: analytic energies resolve their kernels here, so the loop makes
        no dispatch lookup at all. A model that leaves the gradient to autograd and whose program is a feed-forward
        network (:class:`~ebmcore.energies.program.FeedForward`) gets that gradient in closed form
        (:mod:`ebmcore.energies.feedforward`), equal to autograd's, with no graph.

        Checked once here (metadata only, no sync): the model's parameters share one dtype and device, and ``like``
        is on that device, so that a mixed-dtype or meta model is an :class:`InputError`, not torch's error inside.
        """
        if self._parameters or self._modules:
            mismatch = mismatched_parameter(self)
            if mismatch is not None:
                raise InputError(mismatch)
            ref = self._reference_tensor()
            if ref is not None and isinstance(like, Tensor) and ref.device != like.device and not like.is_meta:
                raise InputError(
                    f"{type(self).__name__} holds its parameters on {ref.device} but the states are on {like.device}; "
                    f"move one: model.to('{like.device}') or x.to('{ref.device}')."
                )
        program = self.program()
        if not uses_autograd(self):
            if not isinstance(program, Analytic):  # its own gradient: no kernel may run the network in its place
                program = Opaque(f"{type(self).__name__} computes its own gradient")
            return EnergyFunctions(self.compute_energy, self.compute_gradient, self.compute_energy_and_gradient, program=program)
        network, why = feedforward.closed_form(program, like)
        if network is None:
            return EnergyFunctions(
                self.compute_energy,
                self.compute_gradient,
                self.compute_energy_and_gradient,
                f"autograd ({why})",
                Opaque(why) if isinstance(program, FeedForward) else program,
            )
        fast, slow = feedforward.bind(network, like), self.compute_energy_and_gradient
        device_type = like.device.type

        def energy_and_gradient(x: Tensor) -> tuple[Tensor, Tensor]:
            return slow(x) if autocast_enabled(device_type) else fast(x)

        return EnergyFunctions(
            self.compute_energy, lambda x: energy_and_gradient(x)[1], energy_and_gradient, feedforward.describe(network), network
        )

    # -- checked public API ------------------------------------------------------------------

    def validate(self, x: Tensor, name: str = "x") -> Tensor:
        """Check ``x``'s shape, dtype and device against this model (no sync); return ``x``."""
        if self._modules:  # a tree of modules: walk it once (the naming walk only where two parameters disagree)
            ref, agree = _tree_reference(self)
            if not agree:
                mismatch = mismatched_parameter(self)
                if mismatch is not None:
                    raise InputError(mismatch)
            if ref is None:  # no floating parameter: the first floating buffer fixes the inputs' dtype and device
                ref = self._reference_tensor()
        else:  # one module (an analytic energy): its own tensors, without the tree walk of named_parameters()
            ref = _leaf_reference(self)
            if self._parameters:  # parameters of two dtypes or devices: the general check names them
                mismatch = mismatched_parameter(self)
                if mismatch is not None:
                    raise InputError(mismatch)
        return check_batch(
            x,
            event_shape=self.event_shape,
            dtype=None if ref is None else ref.dtype,
            device=None if ref is None else ref.device,
            name=name,
            owner=type(self).__name__,
        )

    def energy(self, x: Tensor) -> Tensor:
        """``E(x)``: ``x: (n, *event_shape)`` -> ``(n,)``, in ``x``'s dtype and device."""
        self.validate(x)
        return self._checked(self.compute_energy(x), "energy", x)

    def gradient(self, x: Tensor, create_graph: bool = False) -> Tensor:
        """``∇ₓE(x)``: same shape, dtype and device as ``x``; detached unless ``create_graph``. An energy with a
        gradient of its own (``compute_gradient``, e.g. an analytic energy's kernel) is asked for that alone; one
        differentiated by autograd has its energy's shape checked too (the gradient of a ``(n, 2)`` energy would
        silently be that of its sum)."""
        self.validate(x)
        if type(self).compute_gradient is not EnergyModel.compute_gradient:
            grad = self.compute_gradient(x, create_graph)
        else:
            energy, grad = self.compute_energy_and_gradient(x, create_graph)
            check_energy_output(energy, x, owner=type(self).__name__)
        if not isinstance(grad, Tensor):  # .detach() would not name it
            check_gradient_output(grad, x, owner=type(self).__name__)
        return self._checked(grad if create_graph else grad.detach(), "gradient", x)

    def score(self, x: Tensor, create_graph: bool = False) -> Tensor:
        """The score ``−∇ₓE(x) = ∇ₓ log p(x)``."""
        return -self.gradient(x, create_graph)

    def energy_and_gradient(self, x: Tensor, create_graph: bool = False) -> tuple[Tensor, Tensor]:
        """``(E(x): (n,), ∇ₓE(x): x.shape)``."""
        self.validate(x)
        energy, grad = self.compute_energy_and_gradient(x, create_graph)
        return self._checked(energy, "energy", x), self._checked(grad, "gradient", x)

    def forward(self, x: Tensor) -> Tensor:
        """``model(x)``: the checked :meth:`energy`, ``x: (n, *event_shape)`` -> ``(n,)``."""
        return self.energy(x)

    # -- helpers -----------------------------------------------------------------------------

    def _reference_tensor(self) -> Tensor | None:
        """The first floating parameter or buffer: it fixes the dtype and device inputs must have."""
        for t in self.parameters():
            if t.is_floating_point():
                return t
        for t in self.buffers():
            if t.is_floating_point():
                return t
        return None

    def _checked(self, values: Tensor, what: str, x: Tensor) -> Tensor:
        """``values`` (the energy ``(n,)`` or the gradient, shaped like ``x``), checked for shape, then finiteness."""
        owner = type(self).__name__
        if what == "energy":
            check_energy_output(values, x, owner=owner)
        else:
            check_gradient_output(values, x, owner=owner)
        return check_finite(
            values,
            what=f"{type(self).__name__} {what}",
            x=x,
            fix="Check the inputs lie in the energy's domain and its parameters are finite.",
        )
