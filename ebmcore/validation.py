"""Input checks shared by energies, samplers and losses; each error names the problem and the fix."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ebmcore.errors import InputError, NonFiniteError

__all__ = [
    "all_finite",
    "check_batch",
    "check_finite",
    "check_positive",
    "check_number",
    "check_start",
    "check_finite_start",
    "check_energy_output",
    "check_gradient_output",
    "check_generator",
    "check_positive_int",
    "check_count",
    "check_seed",
    "check_finite_parameters",
    "check_placement",
    "parameter_tensor",
]


def _shape(event_shape: tuple[int, ...] | None) -> str:
    return "(n, ...)" if event_shape is None else "(n" + "".join(f", {s}" for s in event_shape) + ")"


def check_batch(
    x: Any,
    *,
    event_shape: tuple[int, ...] | None,
    dtype: torch.dtype | None = None,
    device: torch.device | None = None,
    name: str = "x",
    owner: str = "the energy",
) -> Tensor:
    """Check that ``x`` is a floating tensor of shape ``(n, *event_shape)`` on ``device`` with ``dtype``.

    ``event_shape=None`` accepts any shape with a leading batch dimension.
    Metadata only: no host synchronisation.
    """
    if not isinstance(x, Tensor):
        raise InputError(
            f"{name} must be a torch.Tensor of shape {_shape(event_shape)}, got {type(x).__name__}; "
            f"wrap it with torch.as_tensor({name})."
        )
    if x.is_meta:
        raise InputError(
            f"{name} is on the meta device, which holds shapes but no values, and {owner} checks values: "
            f"make {name} on a real device ('cpu', 'cuda'); the unchecked compute_* methods take meta "
            "tensors, for shapes."
        )
    if not x.is_floating_point():
        raise InputError(f"{name} has dtype {x.dtype}; {owner} needs floating point. Use {name}.float() or {name}.double().")
    if event_shape is not None:
        expected = len(event_shape) + 1
        if x.dim() != expected or tuple(x.shape[1:]) != tuple(event_shape):
            hint = ""
            if x.dim() == expected - 1 and tuple(x.shape) == tuple(event_shape):
                hint = f" For a single point use {name}.unsqueeze(0)."
            elif x.dim() > expected and tuple(x.shape[-len(event_shape) :] if event_shape else ()) == tuple(event_shape):
                hint = f" Flatten the leading dimensions with {name}.reshape(-1, {', '.join(map(str, event_shape))})."
            raise InputError(f"{name} must have shape {_shape(event_shape)} for {owner}, got {tuple(x.shape)}.{hint}")
    elif x.dim() < 1:
        raise InputError(f"{name} must have a leading batch dimension, got a scalar; use {name}.reshape(1, -1).")
    if device is not None and x.device != device:
        raise InputError(
            f"{name} is on {x.device} but {owner} is on {device}; move one: {name}.to('{device}') or model.to('{x.device}')."
        )
    if dtype is not None and x.dtype != dtype:
        raise InputError(
            f"{name} has dtype {x.dtype} but {owner} holds {dtype} parameters; cast one: "
            f"{name}.to({dtype}) or model.to({x.dtype}). (ebmcore never casts silently.)"
        )
    return x


def check_energy_output(values: Any, x: Tensor, *, owner: str) -> Tensor:
    """Check that an energy's ``compute_energy(x)`` gave one floating value per row, ``(n,)`` for ``x: (n, ...)``
    (metadata only: no host sync). A ``(n, 1)`` or scalar output would otherwise broadcast silently in a sampler."""
    n = x.shape[0]
    said = f"{owner}.compute_energy(x) returned"
    if not isinstance(values, Tensor):
        raise InputError(f"{said} a {type(values).__name__}; it must return a tensor of shape ({n},), one energy per row of x.")
    shape = tuple(values.shape)
    if shape == (n,):
        if not values.is_floating_point():
            raise InputError(f"{said} dtype {values.dtype}; energies must be floating point: return them in x's dtype.")
        return values
    if values.dim() == 0:
        fix = (
            "It reduced over the batch (a .sum() or .mean() over rows): return one energy per row and leave the "
            "reduction to the loss; a network whose last layer gives (n, 1) needs .squeeze(-1), not .sum()."
        )
    elif shape == (n, 1) or (values.dim() > 1 and shape[0] == n and values[0].numel() == 1):
        fix = "End compute_energy with .squeeze(-1) (a final nn.Linear(..., 1) gives shape (n, 1))."
    elif values.dim() > 1 and shape[0] == n:
        fix = (
            "Give each row a single energy: make the last layer output one value and .squeeze(-1), "
            "or sum the per-output terms with .flatten(1).sum(1)."
        )
    else:
        fix = "Compute one energy per row of x, without reducing or reshaping over the batch dimension."
    raise InputError(
        f"{said} shape {shape} for x of shape {tuple(x.shape)}; an energy returns one value per row, shape ({n},). {fix}"
    )


def check_gradient_output(grad: Any, x: Tensor, *, owner: str) -> Tensor:
    """Check that an energy's gradient has ``x``'s shape and dtype (metadata only): an integer gradient would move
    the chains by a truncated step, another floating dtype would change the states' dtype."""
    if not isinstance(grad, Tensor) or grad.shape != x.shape:
        got = f"shape {tuple(grad.shape)}" if isinstance(grad, Tensor) else f"a {type(grad).__name__}"
        raise InputError(
            f"{owner}'s gradient is {got} for x of shape {tuple(x.shape)}; compute_gradient(x) must return "
            "a tensor shaped like x (∇ₓE, one row per row of x)."
        )
    if grad.dtype != x.dtype:
        raise InputError(
            f"{owner}'s gradient has dtype {grad.dtype} for x of dtype {x.dtype}; compute_gradient(x) must "
            "return ∇ₓE in x's dtype: compute it in floating point from x, without .long(), .int() or "
            "a cast to another dtype (ebmcore never casts silently)."
        )
    return grad


def all_finite(values: Tensor, *more: Tensor | None) -> bool:
    """Whether every element of ``values`` (and of each tensor of ``more``; None is skipped) is finite, in one host
    sync. A NaN or an infinity always reaches the sum, so a finite sum (float32, float64 for float64 values) answers
    at the cost of one reduction per tensor; only a sum that is not finite, because of one of them or because large
    finite values overflowed, takes the element-wise test (several kernels and a boolean temporary, about 4× the time
    on a small batch). Several tensors (a sampler's initial states and its energy there) are added into one sum, so
    checking them all costs what checking one does in syncs."""
    tensors = [t for t in (values, *more) if t is not None and (t.is_floating_point() or t.is_complex())]
    if not tensors:
        return True
    if all(t.is_floating_point() for t in tensors):
        total = None
        for t in tensors:
            part = t.detach().sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32)
            total = part if total is None else total + part
        if math.isfinite(float(total)):
            return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def check_finite(values: Tensor, *, what: str, x: Tensor | None = None, fix: str = "") -> Tensor:
    """Raise :class:`NonFiniteError` naming the rows where ``values`` is NaN or infinite (one host sync)."""
    if all_finite(values):
        return values
    bad = ~torch.isfinite(values)
    if values.dim() > 1:
        bad = bad.flatten(1).any(1)
    rows = bad.nonzero().flatten()
    shown = rows[:5].tolist()
    msg = f"{what} is non-finite (NaN or inf) for {rows.numel()} of {bad.numel()} rows, first at rows {shown}."
    if x is not None:
        x_bad = ~torch.isfinite(x.flatten(1)).all(1)
        if bool(x_bad[rows].any()):
            msg += f" The inputs themselves are non-finite at rows {x_bad.nonzero().flatten()[:5].tolist()}."
        else:
            msg += f" The inputs there are finite (e.g. x[{shown[0]}] = {x[shown[0]].tolist()}), so the model overflows or leaves its domain."
    if fix:
        msg += f" {fix}"
    raise NonFiniteError(msg)


def check_positive(value: Any, name: str) -> float:
    """A finite, strictly positive Python number."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a positive number, got {value!r}.") from None
    if not (v > 0 and v < float("inf")):
        raise InputError(f"{name} must be a finite positive number, got {value!r}.")
    return v


def check_number(value: Any, name: str, *, minimum: float | None = None, maximum: float | None = None) -> float:
    """A finite real Python number (``True`` is not one), at least ``minimum`` and at most ``maximum`` where given: a
    NaN or an infinity given as a parameter would make every loss or energy NaN or infinite, not an error naming it."""
    if maximum is None:
        at_least = "" if minimum is None else f" >= {minimum:g}"
    else:
        at_least = f" <= {maximum:g}" if minimum is None else f" in [{minimum:g}, {maximum:g}]"
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not (isinstance(value, Tensor) and value.numel() == 1):
        raise InputError(f"{name} must be a finite number{at_least}, got {value!r}.")
    v = float(value)
    if not math.isfinite(v):
        raise InputError(f"{name} must be a finite number{at_least}, got {v!r}; give a finite value.")
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        raise InputError(f"{name} must be a finite number{at_least}, got {v!r}.")
    return v


def check_start(energy: Any, x0: Any, name: str = "x0", *, finite: bool = True) -> Tensor:
    """The starting points ``x0: (n_chains, *event_shape)`` of a sampler of ``energy`` (an ``EnergyModel``): checked
    against it (shape, dtype, device), holding a chain at least, and finite (one host sync): a NaN start would give
    NaN samples, not an error naming it. ``finite=False``: the metadata only, no sync (the caller checks finiteness
    with :func:`check_finite_start`, folded into a check it makes anyway)."""
    energy.validate(x0, name=name)
    if x0.shape[0] == 0:
        raise InputError(
            f"{name} has no chains (shape {tuple(x0.shape)}); give at least one: {name} is (n_chains, *event_shape)."
        )
    return check_finite_start(x0, name) if finite else x0


def check_finite_start(x0: Tensor, name: str = "x0") -> Tensor:
    """:func:`check_start`'s finiteness check of the starting points ``x0`` (one host sync)."""
    return check_finite(x0, what=f"initial state {name}", fix="Start every chain from a finite point.")


def check_generator(generator: Any, like: Tensor | None = None, name: str = "x0") -> None:
    """``generator`` is None or a ``torch.Generator`` on the device type of ``like`` (a tensor called ``name``)."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise InputError(
            f"generator must be a torch.Generator, got {type(generator).__name__}; use torch.Generator().manual_seed(seed)."
        )
    if isinstance(like, Tensor) and not like.is_meta and generator.device.type != like.device.type:
        raise InputError(
            f"generator is on {generator.device} but {name} is on {like.device}; "
            f"use torch.Generator(device={str(like.device)!r}).manual_seed(...)."
        )


def check_positive_int(value: Any, name: str) -> int:
    """A Python ``int`` of at least 1 (``True`` is not one)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError(f"{name} must be a positive integer, got {value!r}.")
    return value


def check_count(value: Any, name: str, *, minimum: int = 0) -> int:
    """A Python ``int`` of at least ``minimum`` (0 by default: a number of steps, where none is a valid run); ``True``
    and ``3.0`` are not counts."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return value


def check_seed(value: Any, name: str = "seed", *, optional: bool = True) -> int | None:
    """A seed for ``torch.Generator().manual_seed``: a Python ``int`` in ``[-2**63, 2**64)`` (or None when
    ``optional``). torch's own refusal of ``False``, ``1.0`` or ``numpy.float64(1)`` is a RuntimeError that names
    neither the argument nor the fix."""
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not -(2**63) <= value < 2**64:
        none = " or None" if optional else ""
        raise InputError(f"{name} must be an integer (a torch.Generator seed, in [-2**63, 2**64)){none}, got {value!r}.")
    return value


def check_finite_parameters(module: Any, *, owner: str) -> None:
    """Raise :class:`NonFiniteError` naming the first parameter of ``module`` (an ``nn.Module``) holding a NaN or an
    infinity: every energy, gradient and loss of such a model is NaN or infinite, and an error naming the parameter
    says why. One host sync for all of them (:func:`all_finite`), so call it once per entry, not per step."""
    params = [p for p in module.parameters() if p.is_floating_point() and not p.is_meta]
    if not params or all_finite(*params):
        return
    for name, p in module.named_parameters():
        if p.is_floating_point() and not p.is_meta and not bool(torch.isfinite(p).all()):
            bad = int((~torch.isfinite(p)).sum())
            raise NonFiniteError(
                f"{owner}: parameter {name!r} holds {bad} NaN or infinite value(s) of {p.numel()}, so its energies "
                "and losses are not finite. Re-initialise the model or load a checkpoint from before it diverged "
                "(a lower learning rate, or the Trainer's watchdog, keeps training from getting there)."
            )


def check_placement(dtype: Any, device: Any, owner: str) -> tuple[torch.dtype | None, torch.device | None]:
    """A constructor's ``dtype`` (None or a floating ``torch.dtype``) and ``device`` (None or what ``torch.device``
    takes), or an :class:`InputError` naming ``owner``."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise InputError(
            f"{owner}: dtype must be a floating torch.dtype (torch.float32, torch.float64, ...) or None, got {dtype!r}."
        )
    if device is not None:
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise InputError(f"{owner}: {device!r} is not a device ({exc}); use e.g. 'cpu' or 'cuda:0'.") from None
    return dtype, device


def parameter_tensor(value: Any, name: str, dtype: torch.dtype | None, device: Any) -> Tensor:
    """``value`` (numbers, nested lists or a tensor) as a finite floating tensor: in ``dtype`` if given, else its own
    floating dtype or the default one."""
    dtype, device = check_placement(dtype, device, name)
    try:
        t = torch.as_tensor(value, device=device)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise InputError(f"{name} must be numbers (a float, nested lists or a tensor), got {value!r} ({exc}).") from None
    if t.is_complex():
        raise InputError(f"{name} must be real numbers, got dtype {t.dtype}.")
    t = t.to(dtype or (t.dtype if t.is_floating_point() else torch.get_default_dtype()))
    if not all_finite(t):
        raise InputError(f"{name} contains NaN or inf values.")
    return t
