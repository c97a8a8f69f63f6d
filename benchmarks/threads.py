"""What the jobs' thread count costs: ``ebm sample`` and ``ebm train`` on their bundled configurations with 1 (the
default) and 2 torch threads and with 0 (the cores no other process keeps busy), idle or with one core kept busy
by a spinning process (``--busy``), interleaved; one JSON file (``--json``).

    .venv/bin/python benchmarks/threads.py [--repeats 2] [--train-steps 300] [--busy] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EBM = [sys.executable, "-m", "ebmcore"]
JOBS = {
    "sample": lambda out, steps: [*EBM, "sample", "--out", out, "--quiet"],
    "train": lambda out, steps: [*EBM, "train", "--out", out, "--quiet", "--steps", str(steps)],
}


def spin() -> subprocess.Popen:
    """A process that keeps one core busy (another user's job)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def timed(job: str, threads: int, steps: int) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        subprocess.run([*JOBS[job](out, steps), "--threads", str(threads)], check=True, env=env, capture_output=True)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--busy", action="store_true", help="keep one core busy with a spinning process")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    busy = spin() if args.busy else None
    rows = []
    try:
        time.sleep(2 if busy else 0)
        for _ in range(args.repeats):
            for job in JOBS:
                for threads in (1, 2, 0):
                    t = timed(job, threads, args.train_steps)
                    rows.append({"job": job, "threads": threads, "wall_s": t, "load_average": os.getloadavg()[0]})
                    print(f"{job:6s} threads={threads}: {t:6.1f} s (load average {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        if busy is not None:
            busy.kill()
    meta = {"cpu_count": os.cpu_count(), "busy_core": args.busy, "train_steps": args.train_steps}
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
