#!/usr/bin/env python
"""One training step of the bundled image configuration (``ebm train digits``), ebm against torchebm.

    benchmarks/.venv/bin/python benchmarks/image_step.py [--repeats 7] [--inner 5] [--threads 1] [--compile] [--json PATH]

The step is that of ``train_digits.toml``: a batch of 64 digits on ``[-1, 1]``, persistent CD with a
replay buffer of 2,000 (5 % of the chains restarted from noise), 20 Langevin steps
``x' = x − 10·∇E(x) + 0.005·ξ``, energy regularisation ``0.1·mean(E⁺² + E⁻²)``, backward, Adam (lr 1e-3), on
the same ``conv`` network (widths 32, 64, SiLU; seeded weights, copied into both). ebm is
``ebm_losses.PersistentContrastiveDivergence("langevin", 20, sampler_options={"step_size": 10.0,
"noise_scale": 0.005}, buffer_size=2000, reinit_fraction=0.05, regularization=0.1)``; torchebm (0.8.9) is
``ContrastiveDivergence(model, LangevinDynamics(model, step_size=10.0, noise_scale=0.005 / sqrt(20)),
k_steps=20, persistent=True, buffer_size=2000, new_sample_ratio=0.05, energy_reg_weight=0.1)`` (its noise is
``noise_scale·√(2h)·ξ``). ``--compile`` adds ``ebm-compile``: the same with the sampler's ``compile=True`` (the
Langevin transition through ``torch.compile``; its one-off compilation is untimed and printed). Both buffers are filled before timing (torchebm's by its own warm-up). One timed
run is ``--inner`` steps; the libraries alternate, ``--repeats`` times; the medians are reported. No timing is
asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time

import torch

H, SIGMA, K, BATCH, BUFFER, REINIT, ALPHA, LR = 10.0, 0.005, 20, 64, 2000, 0.05, 0.1, 1e-3


def digits_batch() -> torch.Tensor:
    from ebm_losses import images

    data = images.load_digits()
    x = images.to_model_range(data.images, data.pixel_range)
    return x[torch.randperm(len(x), generator=torch.Generator().manual_seed(0))[:BATCH]]


def ebm_step(batch: torch.Tensor, compile: bool = False):
    from ebm_losses import ConvEnergy, PersistentContrastiveDivergence

    energy = ConvEnergy(widths=(32, 64), seed=0)
    options = {"step_size": H, "noise_scale": SIGMA} | ({"compile": True} if compile else {})
    loss = PersistentContrastiveDivergence(
        "langevin", K, sampler_options=options, buffer_size=BUFFER, reinit_fraction=REINIT, regularization=ALPHA
    )
    opt = torch.optim.Adam(energy.parameters(), lr=LR)
    g = torch.Generator().manual_seed(1)

    def step() -> float:
        value = loss(energy, batch, generator=g)
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()
        return float(value.detach())

    return step, energy


def torchebm_step(batch: torch.Tensor, weights: dict):
    from torchebm.core import BaseModel
    from torchebm.losses import ContrastiveDivergence
    from torchebm.samplers import LangevinDynamics

    from ebm_losses import ConvEnergy

    net = ConvEnergy(widths=(32, 64), seed=0)
    net.load_state_dict(weights)

    class ConvModel(BaseModel):
        def __init__(self, net: torch.nn.Module) -> None:
            super().__init__()
            self.net = net

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net.compute_energy(x)

    model = ConvModel(net)
    sampler = LangevinDynamics(model, step_size=H, noise_scale=SIGMA / math.sqrt(2 * H))
    loss = ContrastiveDivergence(
        model, sampler, k_steps=K, persistent=True, buffer_size=BUFFER, new_sample_ratio=REINIT, energy_reg_weight=ALPHA
    )
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    g = torch.Generator().manual_seed(1)

    def step() -> float:
        value, _ = loss(batch, generator=g)
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()
        return float(value.detach())

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--inner", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compile", action="store_true", help="also time ebm with the sampler's compile=True")
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batch = digits_batch()
    ebm, energy = ebm_step(batch)
    ebm()  # fills the buffer (noise) and binds the sampler
    libs = {"ebm": ebm}
    if args.compile:
        libs["ebm-compile"], _ = ebm_step(batch, compile=True)
        start = time.perf_counter()
        libs["ebm-compile"]()  # compiles the Langevin transition (torch.compile, once per process)
        print(f"ebm-compile: first step (compilation) {time.perf_counter() - start:.1f} s")
    try:
        libs["torchebm"] = torchebm_step(batch, energy.state_dict())
        libs["torchebm"]()  # initialises its buffer (its own warm-up chains)
    except ImportError as exc:
        print(f"torchebm not available ({exc}): timing ebm only")
    times: dict[str, list[float]] = {name: [] for name in libs}
    for _ in range(args.repeats):
        for name, step in libs.items():
            start = time.perf_counter()
            for _ in range(args.inner):
                step()
            times[name].append((time.perf_counter() - start) / args.inner)
    result = {
        "workload": "one training step of train_digits.toml (PCD-20, conv 32-64, batch 64)",
        "threads": args.threads,
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "median_ms": {k: 1e3 * statistics.median(v) for k, v in times.items()},
        "all_ms": {k: [1e3 * t for t in v] for k, v in times.items()},
    }
    if "torchebm" in libs:
        for name in (n for n in libs if n.startswith("ebm")):
            result[f"torchebm_over_{name}"] = result["median_ms"]["torchebm"] / result["median_ms"][name]
    print(json.dumps({k: v for k, v in result.items() if k != "all_ms"}, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
