"""Group T of ``benchmarks/gpu.py``: the Triton chains' launch configurations on this GPU, for tuning.

``ebm_cuda.triton_chains`` launches the configuration ``launch_config`` gives (chains and warps per program), chosen
without a GPU by the instructions of each configuration's step loop in machine code (``benchmarks/triton_static.py``),
never by a timing. On the one GPU that timed the Langevin chain (in the configuration before: 16 chains per program)
it was 2× slower than the per-step loop (``docs/cuda.md``), so it ranks below it. This group times both Triton chains
over chains per program (``block_n``), warps per program and products (IEEE, TF32, bfloat16), at G3's sizes, beside
the baselines they must beat, measured in the same run:

- **W4** (Langevin on the 2-64-64-1 SiLU MLP, ``w4_chains`` × ``w4_steps``): ``feedforward_langevin_chain`` per
  configuration, against the eager per-step loop (``LangevinSampler(fused=False)``) with IEEE and with TF32 matrix
  products (``torch.set_float32_matmul_precision("high")``). Correctness: the mean energy of the final states
  against the eager loop's, as a two-sample z (the chains draw other noise: they agree in law), the non-finite
  chains, and the largest difference from the first configuration's states (the same seed and stream).
- **W5's chain** (CD-10 on a batch of ``w5_batch``: ``feedforward_contrastive_chain``, the negatives, the loss and its
  weight gradient in one launch) per configuration, against the eager ``ContrastiveDivergence`` loss and backward
  (``fused=False``; no optimizer step in either). Correctness: loss and gradient relative to the first
  configuration's (the same seed and stream: they differ by the products' rounding only).

Each row records the registers, spills and static cost (warp-instructions per chain-step) of its kernel
(``compile_report`` for the device's compute capability), so that the timings test the static model. On the CPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` set before
triton is imported) at :data:`DRY` sizes over two configurations: a test of this code, not figures; without the
interpreter the rows are skipped, saying why.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

CONFIGS: list[tuple[int, int, str]] = [
    (16, 4, "ieee"),
    (16, 16, "ieee"),
    (32, 8, "ieee"),
    (64, 16, "ieee"),
    (64, 4, "tf32"),
    (32, 4, "tf32"),
    (16, 8, "tf32"),
    (128, 8, "tf32"),
    (64, 4, "bf16"),
    (32, 4, "bf16"),
    (16, 8, "bf16"),
    (128, 8, "bf16"),
]
"""``(block_n, num_warps, precision)``, 4 per kind of products: ``launch_config``'s for the 2-64-64-1 network (IEEE
16 on 4 for both kernels; TF32 and bfloat16 64 on 4 for the chain, 32 on 4 for the contrastive kernel), the
configuration it replaced (16 on 16 for IEEE, 16 on 8 for the others) and the next-cheapest in the static count. The
first is the reference of the correctness figures."""

DRY = {"w4_chains": 40, "w4_steps": 2, "cd_chains": 40, "configs": [(16, 4, "ieee"), (32, 4, "bf16")]}
"""Sizes and configurations on the CPU, under the interpreter (seconds per kernel call; it computes TF32 products as
IEEE ones, and bfloat16 products in an emulation of the same products)."""

GRADIENT_TOLERANCE = {"ieee": 1e-3, "tf32": 1e-2, "bf16": 5e-2}
"""The contrastive chain's gradient against the first (IEEE) configuration's, relative, by products: summation order;
TF32's 10 significant bits; bfloat16's 8 (5.0e-3 measured in an emulation at 2,048 chains)."""

CD_STEPS = 10
STEP_SIZE = 0.01


def sweep_rows(
    w4_chains: int,
    w4_steps: int,
    cd_chains: int,
    device: Any,
    repeats: int,
    log: Callable,
    measure: Callable,
    configs: list[tuple[int, int, str]] | None = None,
    out: list[dict] | None = None,
    saved: Callable[[], None] = lambda: None,
) -> list[dict]:
    """The rows of group T (the module docstring), appended to ``out`` (returned) as they are measured, ``saved()``
    after each: a run cut off by a time limit keeps what it measured. ``measure(fn, repeats, device)`` is
    ``gpu.measure``."""
    import torch

    import run as common
    from ebm_cuda import triton_chains, triton_contrastive
    from ebmcore.energies.program import feedforward_of

    dev = torch.device(device)
    interpreted = dev.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    reason = None if interpreted else triton_chains.unavailable_reason()
    if reason is not None and dev.type == "cpu":
        reason += " (on the CPU, TRITON_INTERPRET=1 runs the kernels under Triton's interpreter)"
    out = [] if out is None else out
    if reason is not None:
        out.append({"workload": "T", "label": "the Triton chains' configurations", "skipped": reason})
        return out
    if configs is None:
        configs = DRY["configs"] if interpreted else CONFIGS
    capability = None if interpreted else (lambda cc: 10 * cc[0] + cc[1])(torch.cuda.get_device_capability(dev))
    net = common.make_mlp().to(dev).requires_grad_(False)
    program = feedforward_of(net, 1.0)
    padded = triton_chains.kernel_arguments(program, dev)[1]

    def row(workload: str, variant: str, fn: Callable, **extra: Any) -> dict | None:
        """Time ``fn``; a configuration that cannot launch here (shared memory, say) is a result of the sweep ("not
        run"), a baseline that fails is a failure ("failed", which fails ``gpu_check.py``'s step)."""
        label = f"{workload}: {variant}"
        log(f"  T {label} ...")
        rec: dict[str, Any] = {"workload": workload, "variant": variant, **extra}
        try:
            m = measure(fn, repeats, dev)
        except Exception as exc:  # noqa: BLE001
            default = (extra.get("block_n"), extra.get("num_warps")) == triton_chains.launch_config(
                padded, extra.get("precision", ""), contrastive=workload != "W4"
            )
            what = "not run" if type(exc).__name__ == "OutOfResources" and not default else "failed"
            rec["skipped"] = f"{what}: {common.error_text(exc)}"
            log(f"    {rec['skipped']}")
            out.append(rec)
            saved()
            return None
        result = m.pop("out")
        rec["timing"] = m
        out.append(rec)
        log(f"    median {m['median_s'] * 1e3:.2f} ms")
        return {"rec": rec, "out": result}

    def energies(x: Any) -> Any:
        return net(x.float()).squeeze(-1).double()

    # W4: the eager loop (IEEE and TF32 products), then each configuration of the chain
    import ebm_samplers

    x0 = common.make_x0(w4_chains, 2).to(dev)
    noise = math.sqrt(2 * STEP_SIZE)
    eager = ebm_samplers.LangevinSampler(common.net_energy(net), step_size=STEP_SIZE, fused=False)
    before = torch.get_float32_matmul_precision()
    reference = None
    for name, precision in (("eager per-step loop, IEEE products", "highest"), ("eager per-step loop, TF32 products", "high")):
        torch.set_float32_matmul_precision(precision)
        try:
            got = row("W4", name, lambda: eager.sample(x0, w4_steps, generator=torch.Generator(device=dev).manual_seed(1)))
        finally:
            torch.set_float32_matmul_precision(before)
        if got is not None:
            e = energies(got["out"])
            got["rec"]["figures"] = _law(e, reference)
            saved()
            reference = reference if reference is not None else e
    first_states = None
    for block_n, warps, precision in configs:
        got = row(
            "W4",
            f"Triton chain, block_n {block_n}, {warps} warps, {precision}",
            lambda: triton_chains.feedforward_langevin_chain(
                x0,
                program,
                n_steps=w4_steps,
                step_size=STEP_SIZE,
                noise_scale=noise,
                seed=7,
                offset=0,
                precision=precision,
                block_n=block_n,
                num_warps=warps,
            ),
            block_n=block_n,
            num_warps=warps,
            precision=precision,
            ptxas=_ptxas(triton_chains, capability, block_n, warps, precision, False),
        )
        if got is not None:
            figures = _law(energies(got["out"]), reference)
            if first_states is None:
                first_states = got["out"].clone()
            else:  # the same seed and stream: the configurations differ in the products' rounding only
                figures["max_abs_diff_vs_first"] = float((got["out"] - first_states).abs().max())
            got["rec"]["figures"] = figures
            saved()

    # W5's chain: the eager CD-10 loss and backward, then each configuration of the contrastive chain
    import ebm_losses

    data = common.make_eight_gaussians(cd_chains).to(dev)
    trained = common.make_mlp().to(dev)
    model = common.net_energy(trained)
    loss = ebm_losses.ContrastiveDivergence("langevin", CD_STEPS, sampler_options={"step_size": STEP_SIZE, "fused": False})

    def eager_cd() -> Any:
        trained.zero_grad(set_to_none=True)
        value = loss(model, data, generator=torch.Generator(device=dev).manual_seed(1))
        value.backward()
        return value.detach()

    if row("W5 chain", "eager CD-10 loss and backward", eager_cd) is not None:
        saved()
    first = None
    n = cd_chains
    for block_n, warps, precision in configs:
        got = row(
            "W5 chain",
            f"Triton contrastive chain, block_n {block_n}, {warps} warps, {precision}",
            lambda: triton_contrastive.feedforward_contrastive_chain(
                data,
                program,
                n_steps=CD_STEPS,
                step_size=STEP_SIZE,
                noise_scale=noise,
                seed=7,
                offset=0,
                start=(1.0 / n, None),
                end=(-1.0 / n, None),
                precision=precision,
                block_n=block_n,
                num_warps=warps,
            ),
            block_n=block_n,
            num_warps=warps,
            precision=precision,
            ptxas=_ptxas(triton_chains, capability, block_n, warps, precision, True),
        )  # b None: has_b False
        if got is None:
            continue
        loss_value = float(got["out"][3])
        grads = torch.cat([g.reshape(-1) for g in [*got["out"][4], *got["out"][5]] if g is not None]).double()
        figures: dict[str, Any] = {"loss": loss_value, "grad_norm": float(grads.norm())}
        if first is None:
            first = (loss_value, grads)
        else:
            figures.update(common.relative_differences(loss_value, grads, first, "first"))
        got["rec"]["figures"] = figures
        saved()
    return out


def _ptxas(
    triton_chains: Any, capability: int | None, block_n: int, warps: int, precision: str, contrastive: bool
) -> dict | None:
    """``compile_report``'s registers, spills and warp-instructions per chain-step for a row's kernel (or why it could
    not compile); None under the interpreter (``capability`` None), which compiles nothing."""
    if capability is None:
        return None
    try:
        from ebm_cuda import kernel_report

        r = kernel_report.compile_report(
            capability,
            widths=(2, 64, 64),
            block_n=block_n,
            precision=precision,
            num_warps=warps,
            contrastive=contrastive,
            has_b=False,
        )
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    return {k: r[k] for k in ("registers", "spill_stores", "spill_loads", "per_chain_step")} | {"sm": capability}


def _law(e: Any, reference: Any) -> dict:
    """The mean energy, the non-finite chains, and the two-sample z of the mean against the eager loop's."""
    import torch

    finite = e[torch.isfinite(e)]
    fig: dict[str, Any] = {"mean_energy": float(finite.mean()), "nonfinite_chains": int(e.numel() - finite.numel())}
    if reference is not None:
        se = math.sqrt(float(finite.var()) / finite.numel() + float(reference.var()) / reference.numel())
        fig["z_vs_eager"] = (float(finite.mean()) - float(reference.mean())) / max(se, 1e-30)
    return fig


def sweep_table(recs: list[dict], z_tol: float) -> str:
    """Group T as a markdown table: per row its time, speed-up over its workload's first (eager) row, registers and
    spills, and its correctness, marked **FAIL** where it misses (|z| > ``z_tol``, non-finite chains, or a gradient
    farther from the first configuration's than :data:`GRADIENT_TOLERANCE` allows its products)."""
    head = "| workload | variant | median (ms) | vs eager (IEEE) | registers, spills (bytes) | correctness |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    base = {}
    for r in recs:
        if "skipped" in r:
            lines.append(f"| {r['workload']} | {r.get('variant', '')} | — | — | — | skipped: {r['skipped']} |")
            continue
        t = r["timing"]["median_s"]
        base.setdefault(r["workload"], t)
        f = r.get("figures", {})
        p = r.get("ptxas")
        if "ptxas" not in r:
            regs = "—"
        elif p is None:
            regs = "— (interpreted)"
        else:
            regs = p["error"] if "error" in p else f"{p['registers']}, {p['spill_stores'] + p['spill_loads']} (sm_{p['sm']})"

        if "mean_energy" in f:
            ok = not f["nonfinite_chains"] and abs(f.get("z_vs_eager", 0.0)) <= z_tol
            corr = f"mean E {f['mean_energy']:.5f}" + (f", z vs eager {f['z_vs_eager']:+.2f}" if "z_vs_eager" in f else "")
            if "max_abs_diff_vs_first" in f:
                corr += f", max abs diff vs the first configuration {f['max_abs_diff_vs_first']:.1e}"
            if f["nonfinite_chains"]:
                corr += f", {f['nonfinite_chains']} non-finite chains"
        elif "loss" in f:
            ok = f.get("grad_rel_diff_vs_first", 0.0) <= GRADIENT_TOLERANCE[r["precision"]]
            corr = f"loss {f['loss']:.6g}, grad norm {f['grad_norm']:.5g}"
            if "grad_rel_diff_vs_first" in f:
                corr += (
                    f", rel diff vs the first configuration: loss {f['loss_rel_diff_vs_first']:.1e}, "
                    f"gradient {f['grad_rel_diff_vs_first']:.1e}"
                )
        else:
            ok, corr = True, "(the baseline: its loss is not this op's)"
        lines.append(
            f"| {r['workload']} | {r['variant']} | {1e3 * t:.2f} | {base[r['workload']] / t:.2f} | {regs} | "
            f"{corr}{'' if ok else ' **FAIL**'} |"
        )
    return "\n".join(lines)
