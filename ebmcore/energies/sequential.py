"""An energy made of an ``nn.Sequential`` network, ``E(x) = ±net(x).squeeze(-1)``: the structure says what it computes."""

from __future__ import annotations

from typing import Optional, Sequence

from torch import Tensor, nn

from ebmcore.energies.base import EnergyModel
from ebmcore.energies.program import Opaque, Program, feedforward_of
from ebmcore.errors import InputError

__all__ = ["SequentialEnergy"]


class SequentialEnergy(EnergyModel):
    """``E(x) = net(x).squeeze(-1)`` (``negate``: ``−net(x).squeeze(-1)``) for ``x: (n, *event_shape)``.

    Wrap a network in it rather than writing ``compute_energy`` by hand: ebm then reads what the energy computes
    from the network's modules (:meth:`program`), and a stack of ``nn.Linear`` layers and activations ending in
    ``Linear(·, 1)`` gets its gradient in closed form and, with ``ebm-cuda``, fused kernels. Any other network is
    differentiated by autograd. ``event_shape`` defaults to ``(in_features,)`` of a first ``nn.Linear``.
    """

    def __init__(self, net: nn.Module, *, negate: bool = False, event_shape: Optional[Sequence[int]] = None) -> None:
        super().__init__()
        if not isinstance(net, nn.Module):
            raise InputError(f"SequentialEnergy: net must be an nn.Module (e.g. nn.Sequential), got {type(net).__name__}.")
        self.net = net
        self.negate = bool(negate)
        first = next(iter(net), None) if isinstance(net, nn.Sequential) else None
        if event_shape is not None:
            self.event_shape = tuple(int(s) for s in event_shape)
        elif isinstance(first, nn.Linear):
            self.event_shape = (first.in_features,)

    def compute_energy(self, x: Tensor) -> Tensor:
        """``x: (n, *event_shape)`` -> ``(n,)``."""
        e = self.net(x).squeeze(-1)
        return -e if self.negate else e

    def program(self) -> Program:
        """The network's :class:`~ebmcore.energies.program.FeedForward` program, read from its modules, or
        :class:`~ebmcore.energies.program.Opaque` with the reason (a subclass that overrides ``compute_energy``
        computes something its structure does not say)."""
        if type(self).compute_energy is not SequentialEnergy.compute_energy:
            return Opaque(f"{type(self).__name__} overrides compute_energy, which ebm does not read")
        net = self._modules.get("net")  # self.net without nn.Module.__getattr__'s call (asked on every loss call)
        return feedforward_of(self.net if net is None else net, -1.0 if self.negate else 1.0)
