"""The training's live log: ``log.csv`` rows every k steps that hold the trainer's own history, resumed and rolled back
without a duplicate row, TensorBoard events read back, and nothing written or synced when it is off."""

import csv
import math
import sys

import pytest
import torch

import ebmcore
from ebm_losses import DenoisingScoreMatching, PersistentContrastiveDivergence, Trainer, Watchdog, datasets
from ebm_losses.image_mlp import ImageMLPEnergy
from ebm_losses.training import LOG_COLUMNS, LiveLog
from ebmcore.errors import InputError, MissingDependencyError

TRAIN = datasets.make("eight_gaussians", 1000, generator=torch.Generator().manual_seed(1))


def _pcd():
    return PersistentContrastiveDivergence("langevin", n_steps=3, sampler_options={"step_size": 0.01}, buffer_size=300)


def _trainer(loss=None, **kwargs):
    energy = ebmcore.MLPEnergy(dim=2, hidden=(16, 16), seed=0)
    return Trainer(energy, loss or _pcd(), TRAIN, batch_size=64, lr=1e-3, seed=3, **kwargs)


def _rows(directory):
    with open(directory / "log.csv", newline="") as file:
        return list(csv.DictReader(file))


def test_a_row_every_k_steps_holds_the_history_s_loss_and_finite_measures(tmp_path):
    trainer = _trainer(live_log=LiveLog(tmp_path, every=5))
    history = trainer.fit(40)
    rows = _rows(tmp_path)
    assert list(rows[0]) == list(LOG_COLUMNS)
    assert [int(r["step"]) for r in rows] == list(range(5, 41, 5))  # 40 / 5 rows
    losses = dict(zip(history.steps, history.losses))
    assert [float(r["loss"]) for r in rows] == [losses[int(r["step"])] for r in rows]  # exactly the history's
    for row in rows:
        for column in ("wall_time", "energy_data", "energy_negatives", "grad_norm", "lr"):
            assert math.isfinite(float(row[column])), (column, row)
        assert row["acceptance"] == "" and row["rollbacks"] == "0" and float(row["lr"]) == 1e-3
    assert float(rows[0]["grad_norm"]) > 0
    # the CD loss is mean E(data) − mean E(negatives): the logged energies are the loss's own (same parameters)
    assert all(float(r["energy_data"]) - float(r["energy_negatives"]) == pytest.approx(float(r["loss"]), abs=1e-5) for r in rows)


def test_the_log_changes_nothing_and_costs_one_host_sync_per_row(tmp_path, monkeypatch):
    syncs = {"n": 0}
    for name in ("__float__", "__bool__", "item", "tolist", "cpu"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            syncs["n"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)

    def run(**kwargs):
        trainer = _trainer(DenoisingScoreMatching(0.3), watchdog=False, **kwargs)
        before = syncs["n"]
        trainer.fit(30)
        return trainer, syncs["n"] - before

    off, off_syncs = run()
    on, on_syncs = run(live_log=LiveLog(tmp_path / "on", every=10))
    assert on_syncs == off_syncs + 3  # 30 steps / 10: one sync per row, none on the other steps
    assert all(torch.equal(a, b) for a, b in zip(on.energy.parameters(), off.energy.parameters()))
    assert on.history.losses == off.history.losses
    assert not (tmp_path / "off").exists() and sorted(p.name for p in (tmp_path / "on").iterdir()) == ["log.csv"]


def test_a_resumed_run_continues_the_rows_from_its_checkpoint_without_duplicates(tmp_path):
    straight = _trainer(live_log=LiveLog(tmp_path / "straight", every=5))
    straight.fit(30)
    first = _trainer(live_log=LiveLog(tmp_path / "cut", every=5))
    first.fit(10)
    first.save(tmp_path / "ckpt.pt")
    first.fit(7)  # rows at 15 written after the checkpoint, then "interrupted": they are not part of the resumed run
    resumed = _trainer(live_log=LiveLog(tmp_path / "cut", every=5))
    resumed.load(tmp_path / "ckpt.pt")
    resumed.fit(20)
    cut, whole = _rows(tmp_path / "cut"), _rows(tmp_path / "straight")
    assert [int(r["step"]) for r in cut] == [5, 10, 15, 20, 25, 30]
    assert [r["loss"] for r in cut] == [r["loss"] for r in whole]  # an exact resume logs the same losses
    assert (tmp_path / "cut" / "log.csv").read_text().count("step,") == 1  # one header
    fresh = _trainer(live_log=LiveLog(tmp_path / "cut", every=5))
    fresh.fit(5)  # a run from step 0 starts the file over
    assert [int(r["step"]) for r in _rows(tmp_path / "cut")] == [5]


def _nan_at(call):
    class NaNAt(DenoisingScoreMatching):
        calls = 0

        def __call__(self, energy, data, *, generator=None):
            self.calls += 1
            value = super().__call__(energy, data, generator=generator)
            return value * math.nan if self.calls == call else value

    return NaNAt(0.3)


def test_a_rollback_drops_the_rows_past_the_state_it_returns_to_and_counts_itself(tmp_path):
    trainer = _trainer(_nan_at(28), watchdog=Watchdog(check_every=10), live_log=LiveLog(tmp_path, every=5))
    history = trainer.fit(40)
    rows = _rows(tmp_path)
    assert trainer.watchdog_report()["rollbacks"] == 1
    assert [int(r["step"]) for r in rows] == list(range(5, 41, 5))  # step 25's first pass is dropped, 25 logged again
    losses = dict(zip(history.steps, history.losses))
    assert [float(r["loss"]) for r in rows] == [losses[int(r["step"])] for r in rows]
    assert [r["rollbacks"] for r in rows] == ["0"] * 4 + ["1"] * 4
    assert [float(r["lr"]) for r in rows] == [1e-3] * 4 + [5e-4] * 4


def test_continuing_a_file_drops_rows_past_the_step_a_line_cut_short_and_maps_other_columns(tmp_path):
    (tmp_path / "log.csv").write_text("step,loss,old\n5,1.0,x\n10,2.0,y\n15,3.0,z\n20,4.")  # interrupted mid-line
    with LiveLog(tmp_path).open(("step", "loss", "lr"), after=15) as log:
        log.row(20, {"loss": 4.5, "lr": 0.1})
    assert (tmp_path / "log.csv").read_text() == "step,loss,lr\n5,1.0,\n10,2.0,\n15,3.0,\n20,4.5,0.1\n"
    with LiveLog(tmp_path).open(("step", "loss", "lr"), after=10) as log:
        log.rewind(5)
        log.row(10, {"loss": 2.5})
        with pytest.raises(InputError, match="unknown column"):
            log.row(15, {"los": 1.0})
    assert (tmp_path / "log.csv").read_text() == "step,loss,lr\n5,1.0,\n10,2.5,\n"


def test_bad_arguments_and_a_missing_tensorboard_name_the_fix(tmp_path, monkeypatch):
    with pytest.raises(InputError, match="every must be an integer >= 1"):
        LiveLog(tmp_path, every=0)
    with pytest.raises(InputError, match="pass tensorboard=True"):
        LiveLog(tmp_path, images_every=10)
    with pytest.raises(InputError, match="live_log must be None or an ebm_samplers.live_log.LiveLog"):
        _trainer(live_log=str(tmp_path))
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if the package were not installed
    with pytest.raises(MissingDependencyError, match=r"pip install 'ebm-losses\[tensorboard\]'"):
        LiveLog(tmp_path, tensorboard=True)
    assert "pip install 'ebm-losses[tensorboard]'" in LiveLog.config_problem({"tensorboard": True})
    assert LiveLog.config_problem({"every": 10}) is None and LiveLog.config_problem(True) is None
    assert "unknown key(s) evry" in LiveLog.config_problem({"evry": 10})
    assert not any(tmp_path.iterdir())


def test_tensorboard_events_hold_the_scalars_the_rollback_and_the_negatives(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    images = torch.rand(200, 1, 8, 8) * 2 - 1
    loss = PersistentContrastiveDivergence("langevin", n_steps=3, sampler_options={"step_size": 0.01}, buffer_size=200)
    trainer = Trainer(
        ImageMLPEnergy((1, 8, 8), hidden=(32,), seed=0),
        loss,
        images,
        batch_size=32,
        seed=0,
        live_log=LiveLog(tmp_path, every=4, tensorboard=True, images_every=8),
    )
    trainer.fit(16)
    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    events.Reload()
    tags = events.Tags()
    expected = {f"train/{c}" for c in ("loss", "energy_data", "energy_negatives", "grad_norm", "lr", "rollbacks")}
    assert expected <= set(tags["scalars"]) and "train/acceptance" not in tags["scalars"]  # PCD reports none
    rows = _rows(tmp_path)
    for column in ("loss", "energy_data", "grad_norm"):
        logged = events.Scalars(f"train/{column}")
        assert [e.step for e in logged] == [4, 8, 12, 16]
        assert [e.value for e in logged] == pytest.approx([float(r[column]) for r in rows], rel=1e-6)
    grids = events.Images("train/negatives")
    assert [g.step for g in grids] == [8, 16] and grids[0].width >= 8 and grids[0].height >= 8

    # a rollback is a text event at the step where the divergence was seen
    trainer = _trainer(
        _nan_at(12), watchdog=Watchdog(check_every=5), live_log=LiveLog(tmp_path / "nan", every=5, tensorboard=True)
    )
    trainer.fit(20)
    events = EventAccumulator(str(tmp_path / "nan"))
    events.Reload()
    (text,) = events.Tensors("train/events/text_summary")
    assert text.step == 12 and b"watchdog rollback 1: the loss is nan" in text.tensor_proto.string_val[0]


RUN = """
[data]
dataset = "two_moons"
n_train = 400
n_test = 100

[model]
energy = "mlp"
params = { dim = 2, hidden = [16, 16], seed = 0 }

[loss]
name = "denoising_score_matching"
params = { sigma = 0.2 }

[train]
steps = 20
batch_size = 64
eval_every = 10
checkpoint_every = 10
LIVE

[output]
plots = false
n_model_samples = 0
ais_chains = 0
"""


def test_ebm_train_writes_the_log_in_the_run_directory_and_resume_continues_it(tmp_path, capsys):
    from ebmcore.cli import main

    cfg = tmp_path / "train.toml"
    cfg.write_text(RUN.replace("LIVE", "live_log = { every = 5 }"))
    train = lambda out, *flags: main(["train", str(cfg), "--out", str(tmp_path / out), "--quiet", *flags])  # noqa: E731
    assert train("straight", "--steps", "40") == 0
    assert train("cut") == 0  # 20 steps, then: a run that reached step 30 but whose last checkpoint is step 20
    step_20 = (tmp_path / "cut" / "checkpoint.pt").read_bytes()
    assert train("cut", "--steps", "30", "--resume") == 0
    (tmp_path / "cut" / "checkpoint.pt").write_bytes(step_20)
    (tmp_path / "cut" / "metrics.json").unlink()
    assert [int(r["step"]) for r in _rows(tmp_path / "cut")] == [5, 10, 15, 20, 25, 30]
    assert train("cut", "--steps", "40", "--resume") == 0
    cut, straight = _rows(tmp_path / "cut"), _rows(tmp_path / "straight")
    assert [int(r["step"]) for r in cut] == list(range(5, 41, 5))  # rows 25 and 30 dropped, then logged once again
    assert [r["loss"] for r in cut] == [r["loss"] for r in straight]  # the exact resume logs the same losses
    cfg.write_text(RUN.replace("LIVE", "live_log = { every = 0 }"))
    assert train("bad") == 2 and not (tmp_path / "bad").exists()
    assert "[train]: key 'live_log' must have every = an integer >= 1" in capsys.readouterr().err
