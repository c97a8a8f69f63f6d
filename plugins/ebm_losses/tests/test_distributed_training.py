"""Data-parallel training with 2 processes equals single-process training on the same global batch."""

import os
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).with_name("dist_train_script.py")


def test_two_processes_give_the_single_process_parameters(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "one.pt")], check=True, env=env, timeout=120)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(SCRIPT),
            str(tmp_path / "two.pt"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    for a, b in zip(one["params"], two["params"]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(torch.tensor(one["losses"]), torch.tensor(two["losses"]), rtol=1e-9, atol=1e-10)
    assert one["watchdog"]["rollbacks"] == two["watchdog"]["rollbacks"] == 0
