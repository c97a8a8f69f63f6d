"""The Triton chains' launch configurations and ranks are the recorded device sweep's
(``benchmarks/results/2026-11-27-h100-choices.json``, derived from ``2026-11-27-h100-b11eeb6/T.md``), and the
products follow torch's switch for float32 products unless a sampler or contrastive divergence names them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from ebm_cuda import triton_chains as tc
from ebm_cuda import triton_launch
from ebmcore.errors import InputError

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
CHOICES = RESULTS / "2026-11-27-h100-choices.json"
_ROW = re.compile(
    r"\| (W4|W5 chain) \| Triton (?:contrastive )?chain, block_n (\d+), (\d+) warps, (\w+) \| ([\d.]+) \| ([\d.]+) \| "
    r"(\d+), (\d+) \(sm_90\)"
)


def _sweep() -> list[dict]:
    """The timed rows of the device sweep (a configuration that failed has no time, and no row here)."""
    rows = []
    for line in (RESULTS / json.loads(CHOICES.read_text())["sweep"]).read_text().splitlines():
        m = _ROW.match(line)
        if m:
            kernel = "chain" if m[1] == "W4" else "contrastive"
            rows.append(
                dict(
                    kernel=kernel,
                    precision=m[4],
                    block_n=int(m[2]),
                    warps=int(m[3]),
                    ms=float(m[5]),
                    vs_eager=float(m[6]),
                    spills=int(m[8]),
                )
            )
    return rows


def test_the_recorded_choices_are_the_sweeps_fastest_without_spills():
    recorded = json.loads(CHOICES.read_text())
    rows = _sweep()
    assert len(rows) == 20  # W4: 4 configurations x 3 products; W5's chain: 4 x 2 (bfloat16 products crashed)
    baselines = {k: v["vs_eager"] for k, v in recorded["baselines"].items()}
    for choice in recorded["choices"]:
        fit = [r for r in rows if (r["kernel"], r["precision"]) == (choice["kernel"], choice["precision"]) and not r["spills"]]
        best = min(fit, key=lambda r: r["ms"])
        assert (best["block_n"], best["warps"], best["ms"]) == (choice["block_n"], choice["warps"], choice["median_ms"])
        assert choice["faster"] == (best["vs_eager"] > baselines[choice["kernel"]])
    measured = {(c["kernel"], c["precision"]) for c in recorded["choices"]}
    assert measured == {(r["kernel"], r["precision"]) for r in rows}
    assert {(u["kernel"], u["precision"]) for u in recorded["not_measured"]} == {
        (k, p) for k in ("chain", "contrastive") for p in triton_launch.PRECISIONS
    } - measured


def test_the_codes_launch_configurations_and_ranks_are_the_recorded_ones():
    recorded = json.loads(CHOICES.read_text())
    padded = tuple(recorded["padded"])
    assert padded == tuple(tc._pad(w) for w in (2, 64, 64))
    assert triton_launch.MEASURED_ON.endswith(CHOICES.name)
    assert triton_launch.MEASURED_LAUNCH == {
        (c["kernel"], c["precision"], padded): (c["block_n"], c["warps"]) for c in recorded["choices"]
    }
    assert triton_launch.MEASURED_FASTER == {(c["kernel"], c["precision"]): c["faster"] for c in recorded["choices"]}
    for c in recorded["choices"]:  # what a launch on W4's network takes, and whether it runs at fused=None
        assert tc.launch_config(padded, c["precision"], c["kernel"] == "contrastive") == (c["block_n"], c["warps"])
        reason = triton_launch.unmeasured_reason(c["precision"], c["kernel"] == "contrastive")
        assert (reason is None) == c["faster"], (c, reason)
    # on the H100 the TF32 and bfloat16 chains' best launch was 64 x 4, IEEE's 32 x 8
    assert [tc.launch_config(padded, p) for p in ("tf32", "bf16", "ieee")] == [(64, 4), (64, 4), (32, 8)]
    # not measured: split TF32 products, bfloat16 products in the contrastive kernel (the reason names the bug)
    assert "not measured on a GPU" in triton_launch.unmeasured_reason("tf32x3")
    assert "triton-lang/triton#11366" in triton_launch.unmeasured_reason("bf16", contrastive=True)
    # elsewhere the configuration chosen from the machine code
    assert tc.launch_config((64, 64, 64, 64), "ieee") == tc.static_launch_config((64, 64, 64, 64), "ieee") == (16, 4)
    # the kernels rank above the per-step loop; the products decide at fused=None
    assert tc.TRITON_CHAIN_PRIORITY > 0


def test_the_kernels_declare_their_products_from_torchs_switch_or_the_name():
    from ebm_cuda.triton_contrastive import feedforward_contrastive_chain

    chain, contrastive = tc.feedforward_langevin_chain.products, feedforward_contrastive_chain.products
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert chain(None) == ("ieee", triton_launch.unmeasured_reason("ieee")) and chain(None)[1] is not None
        assert contrastive(None) == ("ieee", None)  # measured faster (W5's chain: 2.69x)
        torch.set_float32_matmul_precision("high")
        assert chain(None) == ("tf32", None) and contrastive(None) == ("tf32", None)
        torch.set_float32_matmul_precision("medium")
        assert chain(None) == ("bf16", None)
        assert contrastive(None)[0] == "bf16" and "illegal memory access" in contrastive(None)[1]
        assert chain("tf32x3")[0] == "tf32x3" and chain("ieee")[0] == "ieee"  # a name overrides the switch
    finally:
        torch.set_float32_matmul_precision(before)
    with pytest.raises(InputError, match="precision must be one of"):
        chain("fp8")


def test_langevin_and_contrastive_divergence_take_a_precision():
    from ebm_losses import ContrastiveDivergence
    from ebm_samplers import LangevinSampler
    from ebmcore import SequentialEnergy

    energy = SequentialEnergy(torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.SiLU(), torch.nn.Linear(8, 1)))
    sampler = LangevinSampler(energy, step_size=0.01, precision="tf32")
    assert sampler.options["precision"] == "tf32"
    x = torch.randn(5, 2)
    # on the CPU the host build's chain declares no products: its path and its numbers are as without precision
    plain = LangevinSampler(energy, step_size=0.01)
    path = sampler.prepare(x, None, {}).path
    assert path == plain.prepare(x, None, {}).path and path.startswith("fused chain; gradient: ")
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(sampler.sample(x, 3, generator=g1), plain.sample(x, 3, generator=g2))
    with pytest.raises(InputError, match="precision must be None or the name"):
        LangevinSampler(energy, precision=32)
    loss = ContrastiveDivergence("langevin", 2, sampler_options={"step_size": 0.01}, precision="bf16")
    assert loss.sampler_for(energy).options["precision"] == "bf16"
    with pytest.raises(InputError, match="sampler contrastive divergence builds by name"):
        ContrastiveDivergence(sampler, 2, precision="bf16")
