"""The training watchdog: forced divergences (a NaN loss, a huge learning rate, collapsed negatives) are rolled back to
the last good state with a lower learning rate, counted, and end in a clear error when no rollback is left."""

import math

import pytest
import torch

import ebmcore
from ebm_losses import DenoisingScoreMatching, Trainer, Watchdog, datasets
from ebmcore.errors import DivergenceError, InputError, NonFiniteError

TRAIN = datasets.make("eight_gaussians", 2000, generator=torch.Generator().manual_seed(1))


class Injected(ebmcore.Loss):
    """Denoising score matching with something forced at given calls (counted over the run, rollbacks included)."""

    def __init__(self, hook=None):
        self.inner, self.hook, self.calls = DenoisingScoreMatching(0.3), hook, 0
        self.last_negatives = None

    def __call__(self, energy, data, *, generator=None):
        self.calls += 1
        value = self.inner(energy, data, generator=generator)
        return self.hook(self, energy, value) if self.hook else value


def _trainer(loss, **kwargs):
    energy = ebmcore.MLPEnergy(dim=2, hidden=(16, 16), seed=0)
    return Trainer(energy, loss, TRAIN, batch_size=64, lr=1e-3, seed=3, **kwargs)


def test_a_healthy_run_is_the_same_with_and_without_the_watchdog():
    on, off = (
        _trainer(DenoisingScoreMatching(0.3), ema_decay=0.9),
        _trainer(DenoisingScoreMatching(0.3), ema_decay=0.9, watchdog=False),
    )
    on.fit(120)
    off.fit(120)
    assert all(torch.equal(a, b) for a, b in zip(on.energy.parameters(), off.energy.parameters()))
    assert on.history.losses == off.history.losses
    report = on.watchdog_report()
    assert report["enabled"] and report["rollbacks"] == 0 and report["events"] == []
    assert report["settings"]["check_every"] == 50 and off.watchdog_report()["enabled"] is False


def test_a_nan_loss_is_rolled_back_and_the_run_continues_from_the_last_good_state_at_half_the_rate():
    nan_at_30 = lambda loss, energy, value: value * math.nan if loss.calls == 30 else value  # noqa: E731
    trainer = _trainer(Injected(nan_at_30), watchdog=Watchdog(check_every=10))
    trainer.fit(50)
    report = trainer.watchdog_report()
    assert report["rollbacks"] == 1
    event = report["events"][0]
    assert event["step"] == 30 and event["rolled_back_to"] == 20 and "the loss is nan" in event["reason"]
    assert event["lr_before"] == 1e-3 and event["lr"] == 5e-4 and trainer.optimizer.param_groups[0]["lr"] == 5e-4
    # the continuation of the step-20 state at half the rate, bit for bit (batches and noise restored too)
    reference = _trainer(DenoisingScoreMatching(0.3), watchdog=False)
    reference.fit(20)
    reference.optimizer.param_groups[0]["lr"] = 5e-4
    reference.fit(30)
    assert all(torch.isfinite(p).all() for p in trainer.energy.parameters())
    assert all(torch.equal(a, b) for a, b in zip(trainer.energy.parameters(), reference.energy.parameters()))
    assert trainer.history.steps == list(range(1, 51)) and trainer.history.losses == reference.history.losses


def test_a_huge_learning_rate_for_three_steps_blows_the_energies_up_and_is_rolled_back():
    def huge_lr(loss, energy, value):
        group = loss.trainer.optimizer.param_groups[0]
        if loss.calls == 21:
            loss.saved, group["lr"] = group["lr"], 10.0
        if loss.calls == 24:
            group["lr"] = loss.saved
        return value

    loss = Injected(huge_lr)
    trainer = _trainer(loss, watchdog=Watchdog(check_every=10))
    loss.trainer = trainer
    trainer.fit(40)
    report = trainer.watchdog_report()
    assert report["rollbacks"] == 1
    event = report["events"][0]
    assert (event["step"], event["rolled_back_to"], event["lr"]) == (30, 20, 5e-4)
    assert "the energy scale blew up" in event["reason"], event["reason"]
    with torch.no_grad():
        spread = float(trainer.energy.compute_energy(TRAIN).std())
    blown = _trainer(Injected(huge_lr), watchdog=False)
    blown.loss.trainer = blown
    blown.fit(40)
    with torch.no_grad():
        blown_spread = float(blown.energy.compute_energy(TRAIN).std())
    assert spread < 10 and blown_spread > 100 * spread, (spread, blown_spread)


def test_a_run_that_diverged_before_its_first_check_is_not_a_rollback_target():
    """The start's energy spread is the reference, so the first check is judged too: a blow-up within the first
    ``check_every`` steps rolls back to the start, not to the blown-up state of the first check."""

    def huge_lr_at_first(loss, energy, value):
        group = loss.trainer.optimizer.param_groups[0]
        if loss.calls == 1:
            loss.saved, group["lr"] = group["lr"], 10.0
        if loss.calls == 4:
            group["lr"] = loss.saved
        return value

    loss = Injected(huge_lr_at_first)
    trainer = _trainer(loss, watchdog=Watchdog(check_every=10))
    loss.trainer = trainer
    trainer.fit(30)
    events = trainer.watchdog_report()["events"]
    assert [(e["step"], e["rolled_back_to"], e["lr"]) for e in events] == [(10, 0, 5e-4)], events
    assert "the energy scale blew up" in events[0]["reason"]
    with torch.no_grad():
        assert float(trainer.energy.compute_energy(TRAIN).std()) < 10


def test_pcd_at_a_huge_learning_rate_stops_with_the_error_not_a_garbage_loss():
    from ebm_losses import PersistentContrastiveDivergence

    energy = ebmcore.MLPEnergy(dim=2, hidden=(16, 16), seed=0)
    trainer = Trainer(
        energy, PersistentContrastiveDivergence(), TRAIN, batch_size=64, lr=50, seed=3, watchdog=Watchdog(check_every=10)
    )
    with pytest.raises(DivergenceError, match=r"energy scale blew up.*no rollback left.*last good state, of step 0"):
        trainer.fit(100)
    assert [e["rolled_back_to"] for e in trainer.watchdog_report()["events"]] == [0, 0, 0]
    assert trainer.step == 0 and trainer.history.losses == []


def test_a_start_that_fails_the_checks_is_the_error_with_nothing_to_roll_back_to():
    trainer = _trainer(DenoisingScoreMatching(0.3))
    with torch.no_grad():
        trainer.energy.net[0].bias[0] = math.nan
    with pytest.raises(
        DivergenceError,
        match=r"the state training starts from \(step 0\) fails the watchdog's check: "
        r"64 non-finite energies .*no good state to roll back to",
    ):
        trainer.fit(5)
    assert trainer.watchdog_report()["rollbacks"] == 0


def test_collapsed_negatives_are_rolled_back_until_none_is_left_then_the_error_says_where():
    def collapse(loss, energy, value):
        if loss.calls > 15:  # from then on every negative is the same point
            loss.last_negatives = torch.zeros(64, 2)
        return value

    trainer = _trainer(Injected(collapse), watchdog=Watchdog(check_every=10, max_rollbacks=2))
    with pytest.raises(
        DivergenceError,
        match=r"training diverged at step 20: the negatives collapsed: their spread 0 is "
        r"under 0.05× the data's .*max_rollbacks=2.*step 10",
    ):
        trainer.fit(40)
    report = trainer.watchdog_report()
    assert report["rollbacks"] == 2 and [e["step"] for e in report["events"]] == [20, 20]
    assert [e["lr"] for e in report["events"]] == [5e-4, 2.5e-4]
    assert trainer.step == 10  # the trainer holds the last good state


def test_without_the_watchdog_a_nan_loss_is_the_error_and_so_it_is_with_no_rollback_allowed():
    nan_at_4 = lambda loss, energy, value: value * math.nan if loss.calls == 4 else value  # noqa: E731
    off = _trainer(Injected(nan_at_4), watchdog=False)
    with pytest.raises(NonFiniteError, match=r"the loss is nan at step 4; the last finite values"):
        off.fit(10)
    none_left = _trainer(Injected(nan_at_4), watchdog=Watchdog(max_rollbacks=0))
    with pytest.raises(DivergenceError, match=r"training diverged at step 4: the loss is nan .*no rollback left"):
        none_left.fit(10)
    assert none_left.step == 0 and all(torch.isfinite(p).all() for p in none_left.energy.parameters())


def test_the_watchdog_record_is_in_the_checkpoint(tmp_path):
    nan_at_12 = lambda loss, energy, value: value * math.nan if loss.calls == 12 else value  # noqa: E731
    trainer = _trainer(Injected(nan_at_12), watchdog=Watchdog(check_every=5))
    trainer.fit(20)
    trainer.save(tmp_path / "ckpt.pt")
    resumed = _trainer(Injected(), watchdog=Watchdog(check_every=5))
    resumed.load(tmp_path / "ckpt.pt")
    assert resumed.watchdog_report() == trainer.watchdog_report() and resumed.watchdog_report()["rollbacks"] == 1
    assert resumed.optimizer.param_groups[0]["lr"] == 5e-4


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"lr_factor": 1.5}, r"lr_factor must be in \(0, 1\)"),
        ({"check_every": 0}, "check_every must be an integer >= 1"),
        ({"energy_factor": 1}, "energy_factor must be a finite number > 1"),
        ({"collapse_fraction": -0.1}, r"collapse_fraction must be in \[0, 1\)"),
    ],
)
def test_bad_watchdog_settings_are_named(kwargs, message):
    with pytest.raises(InputError, match=message):
        Watchdog(**kwargs)


def test_a_watchdog_table_from_a_configuration():
    assert Watchdog.from_config(False) is None and Watchdog.from_config(True) == Watchdog()
    assert Watchdog.from_config({"max_rollbacks": 5}).max_rollbacks == 5
    with pytest.raises(InputError, match="unknown watchdog setting.s. retries; the settings are check_every"):
        Watchdog.from_config({"retries": 5})
    with pytest.raises(InputError, match="watchdog must be True, False or an ebm_losses.Watchdog"):
        _trainer(DenoisingScoreMatching(), watchdog="on")


def test_the_watchdog_example_of_losses_md_prints_what_the_page_shows():
    import contextlib
    import io
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[3] / "docs" / "losses.md").read_text()
    section = page.split("### The training watchdog")[1].split("\n## ")[0]
    code, shown = re.search(r"```python\n(.*?)```\n\n```\n(.*?)```", section, re.S).groups()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "docs/losses.md", "exec"), {"__name__": "__main__"})
    assert printed.getvalue() == shown
