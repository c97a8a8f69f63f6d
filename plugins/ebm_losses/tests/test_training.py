"""Training improves held-out likelihood with every loss; the Trainer resumes exactly and fails loudly."""

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import ebmcore
from ebm_losses import (
    ContrastiveDivergence,
    DenoisingScoreMatching,
    NoiseContrastiveEstimation,
    PersistentContrastiveDivergence,
    SlicedScoreMatching,
    Trainer,
    datasets,
)
from ebmcore.errors import InputError, NonFiniteError
from loss_problems import grid_nll

TRAIN = datasets.make("eight_gaussians", 4000, generator=torch.Generator().manual_seed(1))
TEST = datasets.make("eight_gaussians", 2000, generator=torch.Generator().manual_seed(2))

LOSSES = {
    "cd": lambda: ContrastiveDivergence("langevin", 20, sampler_options={"step_size": 0.01}, regularization=0.1),
    "pcd": lambda: PersistentContrastiveDivergence(
        "langevin", 20, sampler_options={"step_size": 0.01}, regularization=0.1, buffer_size=2000
    ),
    "dsm": lambda: DenoisingScoreMatching(0.3),
    "ssm": lambda: SlicedScoreMatching(variance_reduction=True),
    "nce": lambda: NoiseContrastiveEstimation(noise_ratio=2),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_training_an_mlp_improves_held_out_likelihood(name):
    """Eight Gaussians (true NLL ≈ 1.70 nats): the untrained MLP scores ≈ 4.4; 400 steps must reach < 2.8."""
    energy = ebmcore.MLPEnergy(dim=2, hidden=(64, 64), seed=0)
    before = grid_nll(energy, TEST)
    Trainer(energy, LOSSES[name](), TRAIN, batch_size=256, lr=2e-3, seed=0).fit(400)
    after = grid_nll(energy, TEST)
    assert before > 4.0 and after < 2.8, f"{name}: held-out NLL {before:.2f} -> {after:.2f}"


@pytest.mark.parametrize("name", ["pcd", "nce", "dsm"])
def test_resume_from_a_checkpoint_equals_the_uninterrupted_run(name, tmp_path):
    def trainer():
        return Trainer(
            ebmcore.MLPEnergy(dim=2, hidden=(16, 16), seed=0), LOSSES[name](), TRAIN, batch_size=64, seed=3, ema_decay=0.9
        )

    straight = trainer()
    straight.fit(30)
    first = trainer()
    first.fit(17)  # not a multiple of the epoch: the batch order must resume mid-epoch
    first.save(tmp_path / "ckpt.pt")
    resumed = trainer()
    resumed.load(tmp_path / "ckpt.pt")
    resumed.fit(13)
    for a, b in zip(straight.energy.parameters(), resumed.energy.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(straight.ema.parameters(), resumed.ema.parameters()):
        assert torch.equal(a, b)
    assert straight.history.losses == resumed.history.losses and resumed.step == 30


def test_a_non_finite_loss_stops_training_with_the_step_and_last_values():
    class Exploding(ebmcore.Loss):
        def __call__(self, energy, data, *, generator=None):
            value = energy.compute_energy(data).mean()
            self.calls = getattr(self, "calls", 0) + 1
            return value * float("inf") if self.calls == 4 else value

    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    trainer = Trainer(energy, Exploding(), TRAIN, batch_size=32, watchdog=False)  # with it: test_watchdog.py
    with pytest.raises(
        NonFiniteError, match=r"loss is (-)?inf at step 4; the last finite values \(step, loss\) were \[\(1, .*\(3, "
    ):
        trainer.fit(10)
    assert trainer.step == 3 and all(torch.isfinite(p).all() for p in energy.parameters())


def test_ema_eval_hook_checkpoints_and_progress(tmp_path, capsys):
    seen = []
    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    trainer = Trainer(
        energy,
        DenoisingScoreMatching(0.3),
        TRAIN,
        batch_size=64,
        ema_decay=0.5,
        progress=True,
        eval_fn=lambda e, step: seen.append(step) or {"nll": grid_nll(e, TEST, n=40)},
        eval_every=5,
        checkpoint_path=tmp_path / "run" / "last.pt",
        checkpoint_every=10,
    )
    history = trainer.fit(20)
    assert seen == [5, 10, 15, 20] and [s for s, _ in history.evaluations] == seen
    assert (tmp_path / "run" / "last.pt").exists() and torch.load(tmp_path / "run" / "last.pt", weights_only=False)["step"] == 20
    assert not all(torch.equal(a, b) for a, b in zip(trainer.ema.module.parameters(), energy.parameters()))
    assert "20/20" in capsys.readouterr().err


def test_datasets_and_dataloaders_are_accepted():
    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    Trainer(energy, DenoisingScoreMatching(0.3), TensorDataset(TRAIN), batch_size=50).fit(3)
    loader = DataLoader(TensorDataset(TRAIN[:100]), batch_size=40, shuffle=True)
    assert Trainer(energy, DenoisingScoreMatching(0.3), loader).fit(7).steps[-1] == 7  # wraps around epochs


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"ema_decay": 1.5}, r"ema_decay must be in \(0, 1\)"),
        ({"eval_every": 5}, "give eval_fn and eval_every together"),
        ({"checkpoint_every": 5}, "give checkpoint_path and checkpoint_every together"),
    ],
)
def test_bad_trainer_arguments(kwargs, message):
    with pytest.raises(InputError, match=message):
        Trainer(ebmcore.MLPEnergy(dim=2), DenoisingScoreMatching(), TRAIN, **kwargs)


def test_data_of_the_wrong_shape_is_named():
    with pytest.raises(InputError, match=r"data must have shape \(n, 3\)"):
        Trainer(ebmcore.MLPEnergy(dim=3), DenoisingScoreMatching(), TRAIN).fit(1)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"lr": "big"}, r"lr must be a positive number, got 'big'"),
        ({"lr": float("nan")}, r"lr must be a finite positive number, got nan"),
        ({"seed": "x"}, r"seed must be an integer \(a torch\.Generator seed"),
        ({"batch_size": True}, r"batch_size must be a positive integer, got True"),
        ({"ema_decay": "x"}, r"ema_decay must be in \(0, 1\) .*got 'x'"),
        ({"progress": "yes"}, r"progress must be True or False, got 'yes'"),
        ({"eval_fn": 3, "eval_every": 1}, r"eval_fn must be a function eval_fn\(energy, step\)"),
        ({"eval_fn": lambda energy, step: {}, "eval_every": 0}, r"eval_every must be a positive integer, got 0"),
        ({"checkpoint_path": "c.pt", "checkpoint_every": 0}, r"checkpoint_every must be a positive integer, got 0"),
        (
            {"optimizer": "adam"},
            r"optimizer must be None \(Adam with lr\), a torch\.optim\.Optimizer .* got str 'adam'\. "
            r"For 'adam', pass optimizer=torch\.optim\.Adam\.",
        ),
    ],
)
def test_every_trainer_argument_is_checked_in_the_constructor(options, message):
    """Issue 40: these were tracebacks (torch's TypeError, ZeroDivisionError at the first eval or checkpoint, an
    AttributeError of the string optimizer at the first checkpoint), some only after training had started."""
    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    with pytest.raises(InputError, match=message):
        Trainer(energy, DenoisingScoreMatching(0.1), torch.randn(16, 2), **options)


def test_an_optimizer_class_is_built_with_lr():
    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    trainer = Trainer(energy, DenoisingScoreMatching(0.1), torch.randn(16, 2), torch.optim.SGD, lr=0.05)
    assert isinstance(trainer.optimizer, torch.optim.SGD) and trainer.optimizer.param_groups[0]["lr"] == 0.05


def test_a_model_on_the_meta_device_is_refused_by_the_trainer():
    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0).to("meta")
    with pytest.raises(
        InputError,
        match=r"the energy holds its parameters on the meta device, which holds shapes but "
        r"no values",
    ):
        Trainer(energy, DenoisingScoreMatching(0.1), torch.randn(16, 2))
