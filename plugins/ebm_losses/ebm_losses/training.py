"""A small, explicit training loop for energy models: batches, optimizer, progress, evaluation,
EMA of the weights, checkpoints and exact resume.

Everything random (batch order, the loss's noise and sampler chains) comes from one local
``torch.Generator`` whose state is checkpointed, so ``fit(a + b)`` equals ``fit(a)``, save, load
into a fresh trainer, ``fit(b)`` -- bit for bit (for tensor and ``Dataset`` data).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, Dataset

from ebmcore import EnergyModel, Loss, runfiles
from ebmcore.errors import DivergenceError, InputError, NonFiniteError
from ebmcore.validation import all_finite, check_batch, check_count, check_positive, check_positive_int
from ebm_losses.batches import Batches, LoaderBatches
from ebm_losses.watchdog import Watchdog
from ebm_samplers.live_log import LiveLog

__all__ = ["Trainer", "TrainHistory", "Watchdog", "LiveLog", "LOG_COLUMNS"]

log = logging.getLogger(__name__)

EvalFn = Callable[[EnergyModel, int], dict[str, float]]

LOG_COLUMNS = ("step", "wall_time", "loss", "energy_data", "energy_negatives", "acceptance", "grad_norm", "lr", "rollbacks")
"""The columns of the training's live log (``live_log``): the step, Unix time, the step's loss, the mean energies of its
batch and of the loss's negatives and the global gradient norm (before the update, at the loss's parameters), the
loss's sampler ``acceptance`` where it reports one, the learning rate, and the watchdog's rollbacks so far."""


@dataclass
class TrainHistory:
    """``losses[i]`` is the loss at step ``steps[i]``; ``evaluations`` holds ``(step, metrics)``."""

    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    evaluations: list[tuple[int, dict[str, float]]] = field(default_factory=list)


def _copy(obj: Any) -> Any:
    """A copy of a state dict: tensors cloned, containers rebuilt, other values shared (faster than ``deepcopy``)."""
    if isinstance(obj, Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_copy(v) for v in obj)
    return obj


def _optimizer(optimizer: Any) -> Any:
    """``optimizer`` as the Trainer takes it: None, a ``torch.optim.Optimizer`` or an ``Optimizer`` class (built over
    the parameters with ``lr``); else an :class:`InputError` naming what is accepted."""
    if (
        optimizer is None
        or isinstance(optimizer, torch.optim.Optimizer)
        or (isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer))
    ):
        return optimizer
    hint = ""
    if isinstance(optimizer, str):
        known = {
            n.lower(): n
            for n in dir(torch.optim)
            if isinstance(getattr(torch.optim, n), type) and issubclass(getattr(torch.optim, n), torch.optim.Optimizer)
        }
        if optimizer.lower() in known:
            hint = f" For {optimizer!r}, pass optimizer=torch.optim.{known[optimizer.lower()]}."
    raise InputError(
        f"optimizer must be None (Adam with lr), a torch.optim.Optimizer over the energy's parameters "
        f"(torch.optim.Adam(energy.parameters(), lr=1e-3)) or an Optimizer class (torch.optim.SGD: built "
        f"with lr), got {type(optimizer).__name__} {optimizer!r}.{hint}"
    )


class Trainer:
    """Train ``energy`` by minimising ``loss`` on ``data``.

    ``data``: a tensor ``(N, *event_shape)``, a ``Dataset`` (items are tensors or tuples whose first
    element is the sample) or a ``DataLoader`` (used as is; resume then restarts its epoch).
    ``optimizer`` defaults to Adam with ``lr`` over the energy's and the loss's parameters; an ``Optimizer`` class
    (``torch.optim.SGD``) is built over them with ``lr``.
    ``ema_decay`` keeps an exponential moving average of the weights in ``trainer.ema``.
    ``clip_grad_norm`` rescales the parameters' gradient to at most that global 2-norm before each step
    (``torch.nn.utils.clip_grad_norm_``, no host sync).
    ``eval_fn(energy, step) -> {name: value}`` runs every ``eval_every`` steps;
    ``checkpoint_path`` is written every ``checkpoint_every`` steps.
    ``watchdog`` (on by default; ``False`` turns it off, a :class:`Watchdog` sets its thresholds) rolls a diverging
    run back to its last good state with a lower learning rate (:mod:`ebm_losses.watchdog`); ``watchdog_report()``
    counts the rollbacks. Without it, or with no rollback left, a non-finite loss stops training with an error
    naming the step.
    ``live_log`` (an :class:`~ebm_samplers.live_log.LiveLog`) writes a row of :data:`LOG_COLUMNS` every ``every``
    steps to ``log.csv`` (and TensorBoard), one host sync each, an image grid of the negatives every ``images_every``
    steps, and the watchdog's events; rows past the state a rollback or a resume returns to are dropped.
    ``labels: (N,)`` (tensor ``data`` only) go with their rows to a loss that declares ``needs_labels`` (``jem``):
    ``loss(energy, x, labels=y)``; the batches are drawn as without them.

    Under ``torch.distributed`` (``torchrun``) it trains data-parallel: every rank draws the same
    global batch, computes the loss on its shard (with its own noise stream), and the gradients are
    averaged with ``all_reduce`` weighted by shard size, so the update is that of the global batch.
    Only rank 0 writes checkpoints; a replay buffer (PCD) is per rank, and a resume restores rank 0's
    buffer on every rank.
    """

    def __init__(
        self,
        energy: EnergyModel,
        loss: Loss,
        data: Tensor | Dataset | DataLoader,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        batch_size: int = 256,
        lr: float = 1e-3,
        seed: int = 0,
        ema_decay: float | None = None,
        clip_grad_norm: float | None = None,
        progress: bool = False,
        eval_fn: EvalFn | None = None,
        eval_every: int | None = None,
        checkpoint_path: str | os.PathLike | None = None,
        checkpoint_every: int | None = None,
        watchdog: bool | Watchdog = True,
        live_log: LiveLog | None = None,
        labels: Tensor | None = None,
    ) -> None:
        if not isinstance(energy, EnergyModel):
            raise InputError(f"energy must be an ebmcore.EnergyModel, got {type(energy).__name__}.")
        if not isinstance(loss, Loss):
            raise InputError(f"loss must be an ebmcore.Loss, got {type(loss).__name__}.")
        check_positive_int(batch_size, "batch_size")
        lr = check_positive(lr, "lr")
        if not isinstance(seed, int) or isinstance(seed, bool) or not -(2**63) <= seed < 2**64:
            raise InputError(f"seed must be an integer (a torch.Generator seed, in [-2**63, 2**64)), got {seed!r}.")
        if ema_decay is not None and not (
            isinstance(ema_decay, (int, float)) and not isinstance(ema_decay, bool) and 0 < ema_decay < 1
        ):
            raise InputError(f"ema_decay must be in (0, 1) (a number, or None for no average), got {ema_decay!r}.")
        if not isinstance(progress, bool):
            raise InputError(f"progress must be True or False, got {progress!r}.")
        if eval_fn is not None and not callable(eval_fn):
            raise InputError(f"eval_fn must be a function eval_fn(energy, step) -> {{name: value}}, got {eval_fn!r}.")
        for name, every in (("eval_every", eval_every), ("checkpoint_every", checkpoint_every)):
            if every is not None:
                check_positive_int(every, name)
        optimizer = _optimizer(optimizer)
        if clip_grad_norm is not None and not (
            isinstance(clip_grad_norm, (int, float)) and math.isfinite(clip_grad_norm) and clip_grad_norm > 0
        ):
            raise InputError(f"clip_grad_norm must be a positive number or None, got {clip_grad_norm!r}.")
        if (eval_every is None) != (eval_fn is None):
            raise InputError("give eval_fn and eval_every together.")
        if (checkpoint_every is None) != (checkpoint_path is None):
            raise InputError("give checkpoint_path and checkpoint_every together.")
        if not isinstance(watchdog, (bool, Watchdog)):
            raise InputError(f"watchdog must be True, False or an ebm_losses.Watchdog, got {watchdog!r}.")
        if live_log is not None and not isinstance(live_log, LiveLog):
            raise InputError(
                f"live_log must be None or an ebm_samplers.live_log.LiveLog (LiveLog('runs/x', every=50)), got {live_log!r}."
            )
        self.energy, self.loss = energy, loss
        reference = energy._reference_tensor()
        device = reference.device if reference is not None else (data.device if isinstance(data, Tensor) else torch.device("cpu"))
        if device.type == "meta":
            raise InputError(
                f"{'the energy holds its parameters' if reference is not None else 'data is'} on the meta "
                "device, which holds shapes but no values: a Trainer cannot train there. Build or move the "
                "model and data to 'cpu' or 'cuda' (energy.to_empty(device='cpu') and initialise it, or "
                "energy.to('cpu'))."
            )
        self.generator = torch.Generator(device=device).manual_seed(seed)
        # data parallel under torch.distributed: every rank draws the same global batch from `generator`,
        # trains on its shard with its own stream for the loss's noise, and gradients are averaged.
        self.world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.rank = dist.get_rank() if self.world_size > 1 else 0
        self.loss_generator = self.generator
        if self.world_size > 1:
            from ebmcore.distributed import rank_generator

            self.loss_generator = rank_generator(seed, self.rank, device)
        if isinstance(data, DataLoader):
            self.batches: Batches | LoaderBatches = LoaderBatches(data)
        elif isinstance(data, (Tensor, Dataset)):
            if isinstance(data, Tensor):
                check_batch(data, event_shape=energy.event_shape, name="data", owner="Trainer")  # its shape, once here
            if len(data) == 0:
                raise InputError(
                    f"data is empty (no rows{f', shape {tuple(data.shape)}' if isinstance(data, Tensor) else ''}); "
                    "give at least batch_size rows: check the file or the filter that built it."
                )
            rows = torch.arange(len(data), device=self.generator.device) if labels is not None else data  # labelled: indices
            self.batches = Batches(rows, batch_size, self.generator)
        else:
            raise InputError(f"data must be a tensor, a Dataset or a DataLoader, got {type(data).__name__}.")
        if bool(getattr(loss, "needs_labels", False)) != (labels is not None) or not (
            labels is None or (isinstance(data, Tensor) and isinstance(labels, Tensor) and labels.shape == data.shape[:1])
        ):
            raise InputError(
                f"{type(loss).__name__} takes no labels: drop labels=."
                if labels is not None and not getattr(loss, "needs_labels", False)
                else f"{type(loss).__name__} needs labels: pass labels=y, a tensor (N,) of class indices, one per row "
                "of data given as a tensor (N, *event_shape)."
            )
        self.data, self.labels = data, labels
        params = list(energy.parameters()) + list(loss.parameters())
        self.optimizer = optimizer(params, lr=lr) if isinstance(optimizer, type) else optimizer or torch.optim.Adam(params, lr=lr)
        self.clip_grad_norm = None if clip_grad_norm is None else float(clip_grad_norm)
        self.ema = AveragedModel(energy, multi_avg_fn=get_ema_multi_avg_fn(ema_decay)) if ema_decay else None
        self.progress, self.eval_fn, self.eval_every = progress, eval_fn, eval_every
        self.checkpoint_path = None if checkpoint_path is None else Path(checkpoint_path)
        self.checkpoint_every = checkpoint_every
        self.step = 0
        self.history = TrainHistory()
        self.watchdog: Watchdog | None = Watchdog() if watchdog is True else (watchdog or None)
        self._references: dict[str, float | None] = {"energy": None, "grad": None}
        self._events: list[dict[str, Any]] = []
        self._grad_max: Tensor | None = None  # the largest gradient norm since the last check, on the device
        self._good: dict[str, Any] | None = None  # the last good state (a copy), see _snapshot
        self.live_log = live_log
        self._live: LiveLog | None = None  # the live log while fit() writes it (rank 0)

    def fit(self, n_steps: int) -> TrainHistory:
        """Run ``n_steps`` optimisation steps (continuing from ``self.step``); returns the whole history."""
        check_count(n_steps, "n_steps")
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=n_steps, desc="train", unit="step")
        start, seen, target, first = time.perf_counter(), 0, self.step + n_steps, self.step
        if self.live_log is not None and self.rank == 0:
            self._live = self.live_log.open(LOG_COLUMNS, after=self.step or None)
        try:
            self._fit(target, first, start, seen, bar)
        finally:
            if self._live is not None:
                self._live.close()
                self._live = None
            if bar is not None:
                bar.close()
        return self.history

    def _fit(self, target: int, first: int, start: float, seen: int, bar: Any) -> None:
        """The loop of :meth:`fit`, up to step ``target``."""
        while self.step < target:
            batch = self.batches.next()
            labelled = {} if self.labels is None else {"labels": self.labels[batch.to(self.labels.device)]}
            batch = batch if self.labels is None else self.data[batch.to(self.data.device)]
            weight = 1.0
            if self.world_size > 1:
                from ebmcore.distributed import shard

                rows = shard(batch.shape[0], self.rank, self.world_size)
                weight = (rows.stop - rows.start) / batch.shape[0]
                batch = batch[rows]
                labelled = {k: v[rows] for k, v in labelled.items()}
            if self.watchdog is not None and self._good is None:
                self._check_start(batch)
            try:
                value = self.loss(self.energy, batch, generator=self.loss_generator, **labelled)
            except NonFiniteError:  # the loss refuses non-finite parameters: a diverged step, as a non-finite loss
                if self.step == 0 or all_finite(*self.energy.parameters()):
                    raise  # the data, or a model that came in so
                value = batch.new_full((), math.nan, dtype=torch.float32)
            self.optimizer.zero_grad(set_to_none=True)
            if self.world_size > 1:
                # one all_reduce per step carries the weighted gradients and the loss: every rank gets the
                # global batch's gradient and loss (so all ranks stop together on a non-finite loss)
                if torch.isfinite(value.detach()):
                    value.backward()
                loss_value = self._all_reduce_step(value.detach(), weight)
            else:
                loss_value = float(value.detach())
            if not math.isfinite(loss_value):
                last = list(zip(self.history.steps[-5:], self.history.losses[-5:]))
                if self.watchdog is not None:
                    self._roll_back(self.step + 1, f"the loss is {loss_value} (the last finite values (step, loss) were {last})")
                    if bar is not None:
                        bar.n = self.step - first
                        bar.refresh()
                    continue
                message = (
                    f"the loss is {loss_value} at step {self.step + 1}; the last finite values (step, loss) were {last}. "
                    "No optimizer step was taken with it: the parameters are those after the last finite step (a PCD buffer "
                    "already holds this step's negatives). Lower the learning rate "
                    "or the sampler's step size, add energy regularization, or clip gradients."
                )
                if self._live is not None:
                    self._live.event(self.step + 1, f"stopped: {message}")
                raise NonFiniteError(message)
            if self.world_size == 1:
                value.backward()
            checkpoint_due = self.checkpoint_path is not None and (self.step + 1) % self.checkpoint_every == 0
            check_due = self.watchdog is not None and ((self.step + 1) % self.watchdog.check_every == 0 or checkpoint_due)
            log_due = self._live is not None and self._live.due(self.step + 1)
            norm = None
            if self.clip_grad_norm is not None:
                params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
                norm = torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm).detach().float()
                if self.watchdog is not None:  # the norm before clipping, its largest since the last check, on the device
                    self._grad_max = norm if self._grad_max is None else torch.maximum(self._grad_max, norm)
            elif check_due or log_due:  # unclipped: the norm at the check's and the log's steps only (no norm per step)
                grads = [p.grad for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
                norm = torch.nn.utils.get_total_norm(grads).detach().float() if grads else None
                if check_due:
                    self._grad_max = norm
            logged = self._log_measures(batch, norm) if log_due else None
            self.optimizer.step()
            if self.ema is not None:
                self.ema.update_parameters(self.energy)
            self.step += 1
            seen += batch.shape[0]
            self.history.steps.append(self.step)
            self.history.losses.append(loss_value)
            if check_due:
                reason = self._check(batch)
                if reason is not None:
                    self._roll_back(self.step, reason)
                    if bar is not None:
                        bar.n = self.step - first
                        bar.refresh()
                    continue
            if logged is not None:
                self._log_row(loss_value, logged)
            if self.eval_fn is not None and self.step % self.eval_every == 0:
                self.history.evaluations.append((self.step, dict(self.eval_fn(self.energy, self.step))))
            if checkpoint_due:
                self.save(self.checkpoint_path)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.4g}", samples_per_s=f"{seen / (time.perf_counter() - start):.0f}")

    # -- the live log ---------------------------------------------------------------------------------

    def _log_measures(self, batch: Tensor, grad_norm: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """The live log's measures of a step before its update, on the device (no host sync): the mean energies of
        ``batch`` and of the loss's negatives and ``grad_norm`` (NaN where absent), and the negatives when an image
        grid is due."""
        negatives = getattr(self.loss, "last_negatives", None)
        if not (isinstance(negatives, Tensor) and negatives.shape[1:] == batch.shape[1:]):
            negatives = None
        with torch.no_grad():
            nan = batch.new_full((), math.nan, dtype=torch.float32)
            data = self.energy.compute_energy(batch).float().mean()
            neg = self.energy.compute_energy(negatives).float().mean() if negatives is not None else nan
            grad = grad_norm.to(nan.device) if grad_norm is not None else nan
            values = torch.stack([data, neg, grad])
        assert self._live is not None
        images = negatives if negatives is not None and negatives.dim() == 4 and self._live.images_due(self.step + 1) else None
        return values, images

    def _log_row(self, loss_value: float, measures: tuple[Tensor, Tensor | None]) -> None:
        """Write the live log's row of this step (one host sync), and its image grid when one is due."""
        assert self._live is not None
        values, images = measures
        data, neg, grad = (None if math.isnan(v) else v for v in values.tolist())
        acceptance = getattr(self.loss, "acceptance", None)  # a loss that keeps its sampler's (whitened CD)
        if isinstance(acceptance, Tensor) and acceptance.numel() == 1:
            acceptance = float(acceptance)
        if not isinstance(acceptance, (int, float)) or isinstance(acceptance, bool):
            acceptance = None
        self._live.row(
            self.step,
            {
                "wall_time": time.time(),
                "loss": loss_value,
                "energy_data": data,
                "energy_negatives": neg,
                "acceptance": None if acceptance is None else float(acceptance),
                "grad_norm": grad,
                "lr": float(self.optimizer.param_groups[0]["lr"]),
                "rollbacks": len(self._events),
            },
        )
        if images is not None:
            self._live.images(self.step, images)

    # -- the watchdog ---------------------------------------------------------------------------------

    def watchdog_report(self) -> dict[str, Any]:
        """``{"enabled", "rollbacks", "events": [{"step", "reason", "rolled_back_to", "lr_before", "lr"}], "settings"}``:
        each event is a divergence detected at ``step`` and rolled back to the state of step ``rolled_back_to``,
        the learning rate (of the first parameter group) lowered from ``lr_before`` to ``lr``."""
        return {
            "enabled": self.watchdog is not None,
            "rollbacks": len(self._events),
            "events": [dict(e) for e in self._events],
            "settings": None if self.watchdog is None else self.watchdog.settings(),
        }

    def _check(self, batch: Tensor) -> str | None:
        """The watchdog's check after a step (one host sync): what diverged, or None, which makes this state the last
        good one."""
        assert self.watchdog is not None
        negatives = getattr(self.loss, "last_negatives", None)
        if not (isinstance(negatives, Tensor) and negatives.shape[1:] == batch.shape[1:]):
            negatives = None
        stats = self._measure(batch, negatives, self._grad_max)
        reason = self.watchdog.verdict(stats, self._references)
        if reason is None:
            self._references = self.watchdog.updated(self._references, stats)
            self._grad_max = None
            self._snapshot()
        return reason

    def _check_start(self, batch: Tensor) -> None:
        """The watchdog's check of the state a run starts from, on its first batch before any step (one host sync):
        only a state that passed the checks becomes the last good one, the start included. Its energy spread sets the
        reference when there is none yet, so the first check after steps is judged too (a run that diverged
        within ``check_every`` steps is not kept as a rollback target). A start that fails is a ``DivergenceError``."""
        assert self.watchdog is not None
        try:
            self.loss.check_data(self.energy, batch)  # the data errors name the data, not what the energy made of them
        except NonFiniteError:
            if not all_finite(batch):
                raise
            # non-finite parameters: the check below names what they do (non-finite energies), as a DivergenceError
        stats = self._measure(batch, None, None)
        reason = self.watchdog.verdict(stats, self._references)
        if reason is not None:
            raise DivergenceError(
                f"the state training starts from (step {self.step}) fails the watchdog's check: "
                f"{reason}; there is no good state to roll back to. Start from a model whose energies "
                "are finite on the data (a fresh initialisation or an earlier checkpoint)."
            )
        if all(ref is None for ref in self._references.values()):  # a resumed run keeps its references as they were
            self._references = self.watchdog.updated(self._references, stats)
        self._snapshot()

    def _measure(self, batch: Tensor, negatives: Tensor | None, grad_max: Tensor | None) -> dict[str, float]:
        """The watchdog's measures (:meth:`Watchdog.verdict`'s ``stats``) of the energies of ``batch`` and
        ``negatives``, the gradient norm ``grad_max`` and the spreads, in one host sync (the worst over the ranks)."""
        nan = batch.new_full((), math.nan, dtype=torch.float32)
        with torch.no_grad():
            energies = self.energy.compute_energy(batch).reshape(-1)
            if negatives is not None:
                energies = torch.cat([energies, self.energy.compute_energy(negatives).reshape(-1)])
            energies = energies.float()
            finite = torch.isfinite(energies)
            spread = lambda x: x.flatten(1).float().var(0, correction=0).mean().sqrt()  # noqa: E731
            grad = grad_max.to(nan.device) if grad_max is not None else nan
            values = torch.stack(
                [
                    (~finite).sum().float(),
                    torch.where(finite, energies, 0.0).std(correction=0),
                    (~torch.isfinite(grad)).float() * (grad_max is not None),
                    torch.where(torch.isfinite(grad), grad, nan),
                    spread(negatives) if negatives is not None else nan,
                    spread(batch),
                ]
            )
            if self.world_size > 1:  # every rank decides alike: the worst of each measure over the ranks
                sign = values.new_tensor([1, 1, 1, 1, -1, -1])
                worst = torch.nan_to_num(values * sign, nan=-math.inf)
                dist.all_reduce(worst, op=dist.ReduceOp.MAX)
                values = torch.where(torch.isneginf(worst), nan, worst * sign)
        keys = ("nonfinite_energies", "energy_spread", "nonfinite_grad", "grad_max", "negatives_spread", "data_spread")
        return dict(zip(keys, values.tolist()))

    def _snapshot(self) -> None:
        """Keep a copy of the current state (all of :meth:`state_dict` but the history, of which only the lengths)."""
        state = {k: v for k, v in self.state_dict().items() if k != "history"}
        self._good = {"state": _copy(state), "lengths": (len(self.history.steps), len(self.history.evaluations))}

    def _roll_back(self, step: int, reason: str) -> None:
        """Restore the last good state with every learning rate times ``lr_factor``, or raise ``DivergenceError``."""
        assert self.watchdog is not None and self._good is not None
        good_step = self._good["state"]["step"]
        lrs = [group["lr"] for group in self.optimizer.param_groups]
        state = _copy(self._good["state"])  # loading may alias the tensors given: keep the copy intact
        n_steps, n_evals = self._good["lengths"]
        self.load_state_dict(
            {
                **state,
                "history": {
                    "steps": self.history.steps[:n_steps],
                    "losses": self.history.losses[:n_steps],
                    "evaluations": self.history.evaluations[:n_evals],
                },
            },
            watchdog=False,
        )
        self._grad_max = None
        if self._live is not None:
            self._live.rewind(good_step)
        if len(self._events) >= self.watchdog.max_rollbacks:
            before = "; ".join(f"step {e['step']}: {e['reason']}" for e in self._events) or "none"
            message = (
                f"training diverged at step {step}: {reason}. The watchdog has no rollback left "
                f"(max_rollbacks={self.watchdog.max_rollbacks}; earlier rollbacks: {before}); the trainer holds the "
                f"last good state, of step {good_step}. Lower the learning rate or the sampler's step size, add energy "
                "regularization or clip gradients, or allow more rollbacks: Watchdog(max_rollbacks=...) "
                "([train] watchdog = { max_rollbacks = ... } in a configuration)."
            )
            if self._live is not None:
                self._live.event(step, f"stopped: {message}")
            raise DivergenceError(message)
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr * self.watchdog.lr_factor
        event = {
            "step": step,
            "reason": reason,
            "rolled_back_to": good_step,
            "lr_before": lrs[0],
            "lr": self.optimizer.param_groups[0]["lr"],
        }
        self._events.append(event)
        if self._live is not None:
            self._live.event(
                step,
                f"watchdog rollback {len(self._events)}: {reason}; rolled back to step {good_step}, "
                f"learning rate {lrs[0]:.4g} -> {event['lr']:.4g}",
            )
        log.warning(
            "watchdog: training diverged at step %d (%s); rolled back to step %d, learning rate %.4g -> %.4g "
            "(rollback %d of at most %d)",
            step,
            reason,
            good_step,
            lrs[0],
            event["lr"],
            len(self._events),
            self.watchdog.max_rollbacks,
        )

    def _all_reduce_step(self, loss: torch.Tensor, weight: float) -> float:
        """Sum over ranks of (shard weight × gradient) and of (shard weight × loss), in one collective."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.flatten() for p in params] + [loss.reshape(1).to(params[0].dtype)]) * weight
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        return float(flat[-1])

    # -- checkpoints ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs: step, energy, optimizer, loss and EMA states, the trainer's generator and
        torch's global RNG state, the batch order and position, and the history."""
        return {
            "step": self.step,
            "energy": self.energy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "loss": self.loss.state_dict(),
            "ema": None if self.ema is None else self.ema.state_dict(),
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "batches": self.batches.state_dict(),
            "history": {"steps": self.history.steps, "losses": self.history.losses, "evaluations": self.history.evaluations},
            "watchdog": {
                "references": dict(self._references),
                "events": [dict(e) for e in self._events],
                "grad_max": self._grad_max,
            },
        }

    def load_state_dict(self, state: dict[str, Any], *, watchdog: bool = True) -> None:
        """Restore :meth:`state_dict`'s output into this trainer (the EMA only if both have one); see :meth:`load`.
        The restored state becomes the watchdog's last good state; ``watchdog=False`` leaves the watchdog's own record
        (references, rollbacks) as it is (a rollback)."""
        self.step = state["step"]
        self.energy.load_state_dict(state["energy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.loss.load_state_dict(state["loss"])
        if self.ema is not None and state["ema"] is not None:
            self.ema.load_state_dict(state["ema"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        self.batches.load_state_dict(state["batches"])
        self.history = TrainHistory(**state["history"])
        if watchdog:
            record = state.get("watchdog") or {}  # a checkpoint from before the watchdog has none
            self._references = dict(record.get("references") or {"energy": None, "grad": None})
            self._events = [dict(e) for e in record.get("events", [])]
            self._grad_max = record.get("grad_max")
            self._good = None  # taken when fit() starts: the state as loaded

    def save(self, path: str | os.PathLike) -> None:
        """Write a checkpoint atomically (a temporary file, fsync, renamed over ``path``); rank 0 only."""
        if self.rank != 0:
            return
        path = Path(path)
        runfiles.make_dir(path.parent)
        runfiles.save_torch(self.state_dict(), path)

    def load(self, path: str | os.PathLike) -> None:
        """Resume from a checkpoint written by :meth:`save` (same energy, loss and data set-up)."""
        self.load_state_dict(
            runfiles.load_torch(
                Path(path), what="a training checkpoint", fix="start the training again with --overwrite (or another --out)"
            )
        )
