"""Run by test_distributed_training.py, alone or under torchrun: train and save the final parameters."""

import sys

import torch

import ebmcore
from ebm_losses import ScoreMatching, Trainer, Watchdog, datasets
from ebmcore import distributed

run = distributed.init(timeout_s=30)
energy = ebmcore.MLPEnergy(dim=2, hidden=(16, 16), seed=0, dtype=torch.float64)
data = datasets.make("two_moons", 512, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
trainer = Trainer(
    energy, ScoreMatching(), data, batch_size=64, lr=1e-2, seed=1, watchdog=Watchdog(check_every=5)
)  # its checks all-reduce their measures: ranks decide alike
trainer.fit(25)
if run.is_main:
    torch.save(
        {
            "params": [p.detach().clone() for p in energy.parameters()],
            "losses": trainer.history.losses,
            "watchdog": trainer.watchdog_report(),
        },
        sys.argv[1],
    )
distributed.shutdown(run)
