#!/usr/bin/env python
"""Write the "Current results" section of benchmarks/README.md from the committed results files.

    python benchmarks/report.py            # rewrite the section in place
    python benchmarks/report.py --check    # exit 1 if the README differs from what would be written

Reads every ``benchmarks/results/*.json`` that ``run.py --json`` wrote (files of another shape,
such as ``gpu.py``'s, and ``--quick`` runs are skipped), takes for each workload the latest run
that measured it (by the run's start date), and writes the tables between the two marker comments
``<!-- results:start -->`` and ``<!-- results:end -->``. Every number in the section comes from
those files; nothing else in the README is touched. Standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
README = HERE / "README.md"
START = "<!-- results:start -->"
END = "<!-- results:end -->"
LOSS_KINDS = ("cd", "ssm", "dsm")
PEERS = (("torchebm", "torchebm"), ("blackjax", "BlackJAX"))
NAMES = {"blackjax": "BlackJAX"}  # how a library's key is shown


@dataclass(frozen=True)
class Run:
    """One results file of ``run.py --json``: its file name, start date, ``meta`` and ``workloads``."""

    name: str
    date: datetime.datetime
    meta: dict[str, Any]
    workloads: dict[str, Any]


# ----------------------------------------------------------------------------------------------
# Reading and selecting
# ----------------------------------------------------------------------------------------------


def load_runs(results_dir: Path) -> list[Run]:
    """Every run.py results file in ``results_dir``, oldest first (ties broken by file name)."""
    runs = []
    for path in sorted(Path(results_dir).glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        meta, workloads = data.get("meta"), data.get("workloads")
        if not isinstance(meta, dict) or not isinstance(workloads, dict) or "date" not in meta:
            continue  # not written by run.py (e.g. gpu.py's results)
        if meta.get("quick"):
            continue  # --quick sizes: a smoke test, the figures mean nothing
        runs.append(Run(path.name, datetime.datetime.fromisoformat(meta["date"]), meta, workloads))
    return sorted(runs, key=lambda r: (r.date, r.name))


def workload_order(wid: str) -> tuple[int, int, str]:
    """W1..Wn first, then S1..Sn, then anything else, each numerically."""
    m = re.fullmatch(r"([A-Z]+)(\d+)", wid)
    if not m:
        return (2, 0, wid)
    return ({"W": 0, "S": 1}.get(m.group(1), 2), int(m.group(2)), m.group(1))


def latest_per_workload(runs: list[Run]) -> dict[str, Run]:
    """For each workload id, the latest run (by start date) that measured it, in workload order."""
    chosen: dict[str, Run] = {}
    for run in sorted(runs, key=lambda r: (r.date, r.name)):
        for wid in run.workloads:
            chosen[wid] = run  # later runs replace earlier ones
    return {wid: chosen[wid] for wid in sorted(chosen, key=workload_order)}


# ----------------------------------------------------------------------------------------------
# Formatting
# ----------------------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    """A median in ms with three significant figures (at least the integer part)."""
    v = 1e3 * seconds
    if v >= 100:
        return f"{v:.0f} ms"
    return f"{v:.{max(0, 2 - int(f'{v:e}'.split('e')[1]))}f} ms"


def ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def rate(x: float) -> str:
    """Samples per second as K or M."""
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.0f} K"


def plural(n: Any, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def when(run: Run) -> str:
    """The run's start as ``YYYY-MM-DD HH:MM UTC`` (or with its UTC offset)."""
    off = run.date.utcoffset()
    if off is None or off == datetime.timedelta(0):
        return run.date.strftime("%Y-%m-%d %H:%M") + " UTC"
    return run.date.strftime("%Y-%m-%d %H:%M %z")


def modified_code(run: Run) -> list[str]:
    """The files that differed from the run's commit, results files left out (a run writes its own)."""
    return [p for p in run.meta.get("git", {}).get("modified") or [] if not p.startswith("benchmarks/results/")]


def commit(run: Run) -> str:
    text = f"`{run.meta.get('git', {}).get('commit', '?')}`"
    if modified_code(run):
        text += " + uncommitted changes"
    return text


def link(run: Run, results_dir: Path, readme: Path) -> str:
    rel = os.path.relpath(Path(results_dir) / run.name, Path(readme).parent).replace(os.sep, "/")
    return f"[`{run.name}`]({rel})"


def source(run: Run, results_dir: Path, readme: Path) -> str:
    return f"{link(run, results_dir, readme)}, {when(run)}, {commit(run)}"


def check(fig: dict[str, Any], kind: str) -> str:
    """The correctness figure of one library's row, as short as the table needs."""
    bad = f", **{fig['nonfinite_chains']} non-finite chains**" if fig.get("nonfinite_chains") else ""
    if kind in LOSS_KINDS:
        rel = abs(fig["loss"] - fig["loss_formula"]) / max(abs(fig["loss_formula"]), 1e-30)
        return f"{rel:.1e}" + (" **non-finite**" if fig.get("nonfinite") else "")
    if kind == "nuts":
        return f"{fig['ess_bulk_min']:,.0f}" + bad
    if "moments_z_max" in fig:
        ok = "" if fig.get("moments_ok", True) else " **fails**"
        return f"{fig['moments_z_max']:.1f}{ok}" + bad
    if "mean_x2" in fig:
        return f"{fig['mean_x2']:.4f}" + bad
    if "mean_energy" in fig:
        return f"{fig['mean_energy']:.4f}" + bad
    parts = []
    if "acceptance" in fig:
        parts.append(f"{fig['acceptance']:.3f}")
    if "cov_err_vs_ula_law" in fig:
        parts.append(f"{fig['cov_err_vs_ula_law']:.3f}")
    elif "cov_err" in fig:
        parts.append(f"{fig['cov_err']:.3f}")
    return ", ".join(parts) + bad


def check_name(fig: dict[str, Any], kind: str) -> str:
    """What ``check`` reports for this kind of row."""
    if kind in LOSS_KINDS:
        return "relative difference of the loss from its plain-torch formula"
    if kind == "nuts":
        return "min bulk ESS"
    if "moments_z_max" in fig:
        return f"max \\|z\\| of the moments vs the {fig.get('law', 'exact law')}"
    if "mean_x2" in fig:
        return f"E[x²] (quadrature {fig['mean_x2_quadrature']:.4f})"
    if "mean_energy" in fig:
        return "mean energy of the samples"
    names = []
    if "acceptance" in fig:
        names.append("acceptance")
    names.append("max cov err vs the exact ULA law" if "cov_err_vs_ula_law" in fig else "max cov err")
    return ", ".join(names)


def short_path(path: str) -> str:
    """``fused chain X (backend)`` -> ``fused chain `X```; ``per-step loop (fused=False)`` -> ``per-step loop``."""
    m = re.match(r"fused chain (\w+)", path)
    return f"fused chain `{m.group(1)}`" if m else path.split(" (")[0]


def ebm_path(run: Run, w: dict[str, Any]) -> str:
    """How the ``ebm`` row ran: a fused chain, the per-step loop, the functional step."""
    kind = w["workload"]["kind"]
    r = w["results"].get("ebm", {})
    if kind in LOSS_KINDS or kind == "nuts":
        return "—"
    if kind.endswith("_step"):
        return "functional step"
    if r.get("path"):
        return short_path(r["path"])
    cuda = run.meta.get("versions", {}).get("ebm_cuda", "")
    if not cuda or cuda.startswith("not installed"):
        return "per-step loop (no ebm-cuda)"
    return "per-step loop"


def with_check(value: str, r: dict[str, Any] | None, kind: str) -> str:
    return value if r is None else f"{value} ({check(r['figures'], kind)})"


# ----------------------------------------------------------------------------------------------
# The section
# ----------------------------------------------------------------------------------------------


def main_table(chosen: dict[str, Run], results_dir: Path, readme: Path) -> list[str]:
    """One row per workload: medians and ratios of the run that measured it last, checks beside them."""
    lines = [
        "| workload | ebm median | ebm's path | ebm-step median | torchebm / ebm | torchebm / ebm-step "
        "| BlackJAX / ebm | BlackJAX / ebm-step | correctness figure (in parentheses) | results file, date, commit |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for wid, run in chosen.items():
        w = run.workloads[wid]
        kind, res = w["workload"]["kind"], w["results"]
        ebm, step = res.get("ebm"), res.get("ebm-step")
        what = ", ".join(re.sub(r" ?\([^)]*\)", "", w["workload"]["what"]).split(", ")[:2])
        cells = [f"{wid} {what}"]
        cells.append(with_check(ms(ebm["median_s"]), ebm, kind) if ebm else "—")
        cells.append(ebm_path(run, w))
        cells.append(with_check(ms(step["median_s"]), step, kind) if step else "—")
        for peer, _ in PEERS:
            r = res.get(peer)
            cells.append(with_check(ratio(r["ratio_vs_ebm"]), r, kind) if r else "—")
            cells.append(ratio(r.get("ratio_vs_ebm_step")) if r and step else "—")
        any_fig = next(iter(res.values()))["figures"]
        cells.append(check_name(any_fig, kind))
        cells.append(source(run, results_dir, readme))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def notes(chosen: dict[str, Run]) -> list[str]:
    """Figures of the chosen runs that do not fit the table: same-noise differences, S1/S2's object API,
    samples/s against the guides, and W1 vs S4 (the same workload) as a measure of noise."""
    out = []
    same = []
    for wid, run in chosen.items():
        r = run.workloads[wid]["results"].get("torchebm")
        if r and "max_abs_diff_vs_ebm_samples" in r["figures"]:
            ref = r["figures"].get("same_noise_ref", "ebm")
            same.append(f"{wid} {r['figures']['max_abs_diff_vs_ebm_samples']:.1e} (vs {ref})")
    if same:
        out.append(
            "- **Same noise:** torchebm draws the same `torch.Generator` noise as ebm's per-step path, so "
            "its samples are compared with those directly; max abs difference: " + ", ".join(same) + "."
        )
    for wid, run in chosen.items():
        res = run.workloads[wid]["results"]
        objs = [(lib, r) for lib, r in res.items() if lib.endswith(":sample1")]
        if objs and "ebm" in res:
            parts = [
                f"`{lib}` {ms(r['median_s'])} per step ({ratio(r['ratio_vs_ebm'])}× the functional step"
                + (f", {short_path(r['path'])}" if r.get("path") else "")
                + ")"
                for lib, r in objs
            ]
            out.append(f"- **{wid}, object API:** `sample(x, 1)` called once per step: " + "; ".join(parts) + ".")
    guides = []
    for wid, run in chosen.items():
        wl, res = run.workloads[wid]["workload"], run.workloads[wid]["results"]
        if wl.get("guide_rate"):
            parts = [f"{NAMES.get(lib, lib)} {rate(r['samples_per_s'])}" for lib, r in res.items()]
            out.append(
                f"- **{wid} samples/s** (chains × steps / median): "
                + ", ".join(parts)
                + f"; the performance guides quote {wl['guide']}."
            )
        elif wl.get("guide") and "ebm" in res:
            guides.append(f"{wid} {wl['guide']} (ebm here: {ms(res['ebm']['median_s'])})")
    if guides:
        out.append("- **The performance guides' figures:** " + ", ".join(guides) + ".")
    noise = []
    for run in sorted({id(r): r for r in chosen.values()}.values(), key=lambda r: (r.date, r.name)):
        a, b = run.workloads.get("W1"), run.workloads.get("S4")
        if a and b and "ebm" in a["results"] and "ebm" in b["results"]:
            x, y = a["results"]["ebm"]["median_s"], b["results"]["ebm"]["median_s"]
            noise.append(f"{max(x, y) / min(x, y):.2f}× in `{run.name}`")
    if noise:
        out.append(
            "- **Noise:** S4 is W1 measured a second time in the same run; ebm's two medians differ by " + ", ".join(noise) + "."
        )
    return out


def loss_table(chosen: dict[str, Run], results_dir: Path, readme: Path) -> list[str]:
    """W5–W7: time per step, the loss against its plain-torch formula, and torchebm against ebm (same draws)."""
    rows = [(wid, run) for wid, run in chosen.items() if run.workloads[wid]["workload"]["kind"] in LOSS_KINDS]
    if not rows:
        return []
    lines = [
        "| workload | ebm median per step | torchebm median per step | torchebm / ebm | loss: ebm (formula) "
        "| gradient norm: ebm | torchebm vs ebm (same draws): rel. diff of loss, gradient | results file, date, commit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for wid, run in rows:
        res = run.workloads[wid]["results"]
        e, t = res["ebm"], res.get("torchebm")
        ef = e["figures"]
        diff = "—"
        if t and "loss_rel_diff_vs_ebm" in t["figures"]:
            tf = t["figures"]
            diff = f"{tf['loss_rel_diff_vs_ebm']:.1e}, {tf['grad_rel_diff_vs_ebm']:.1e}"
            if "negatives_max_abs_diff_vs_ebm" in tf:
                diff += (
                    f"; max abs diff of the negatives {tf['negatives_max_abs_diff_vs_ebm']:.1e}, "
                    f"of the weights after the Adam step {tf['params_after_max_abs_diff_vs_ebm']:.1e}"
                )
        lines.append(
            f"| {wid} | {ms(e['median_s'])} | {ms(t['median_s']) if t else '—'} | "
            f"{ratio(t['ratio_vs_ebm']) if t else '—'} | {ef['loss']:.6g} ({ef['loss_formula']:.6g}) | "
            f"{ef['grad_norm']:.5g} | {diff} | {source(run, results_dir, readme)} |"
        )
    return lines


def nuts_table(chosen: dict[str, Run], results_dir: Path, readme: Path) -> list[str]:
    """W8: ESS per second and the sampler's diagnostics, per library."""
    rows = [(wid, run) for wid, run in chosen.items() if run.workloads[wid]["workload"]["kind"] == "nuts"]
    if not rows:
        return []
    lines = [
        "| workload | library | median | min bulk ESS | ESS/s | ebm's ESS/s ÷ this | acceptance | divergences "
        "| max R-hat | leapfrog steps / iteration: mean, max | min bulk ESS, seeds 1–5 | results file, date, commit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for wid, run in rows:
        for lib, r in run.workloads[wid]["results"].items():
            f = r["figures"]
            seeds = list(f.get("ess_bulk_min_by_seed", {}).values())
            spread = f"{min(seeds):,.0f}–{max(seeds):,.0f}" if seeds else "—"
            lines.append(
                f"| {wid} | {NAMES.get(lib, lib)} | {ms(r['median_s'])} | {f['ess_bulk_min']:,.0f} | {r['ess_per_s']:,.0f} | "
                f"{'1 (ref)' if lib == 'ebm' else ratio(r.get('ebm_ess_per_s_over_this'))} | {f['acceptance']:.3f} | {f['divergences']} | "
                f"{f['rhat_max']:.4f} | {f['leapfrog_mean']:.2f}, {f['leapfrog_max']} | {spread} | "
                f"{source(run, results_dir, readme)} |"
            )
    return lines


def bf16_table(chosen: dict[str, Run], results_dir: Path, readme: Path) -> list[str]:
    """W4-W7 in bfloat16 (``ebm-bf16``: W4's bf16 products, W5-W7 under autocast) beside float32 ebm of the same
    run, with the accuracy cost."""
    rows = [(wid, run) for wid, run in chosen.items() if "ebm-bf16" in run.workloads[wid]["results"]]
    if not rows:
        return []
    lines = [
        "| workload | ebm float32 median | ebm bf16 median | float32 / bf16 | float32 figure | bf16 figure "
        "| bf16 against float32 (same draws) | results file, date, commit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for wid, run in rows:
        w = run.workloads[wid]
        kind, e, b = w["workload"]["kind"], w["results"]["ebm"], w["results"]["ebm-bf16"]
        f = b["figures"]
        if kind in LOSS_KINDS:
            cost = (
                f"rel. diff of loss {f['loss_rel_diff_vs_ebm']:.1e}, of gradient {f['grad_rel_diff_vs_ebm']:.1e}"
                if "loss_rel_diff_vs_ebm" in f
                else "—"
            )
        else:
            cost = (
                f"max abs diff of the samples {f['max_abs_diff_vs_ebm_samples']:.1e}"
                if "max_abs_diff_vs_ebm_samples" in f
                else "—"
            )
        lines.append(
            f"| {wid} | {ms(e['median_s'])} | {ms(b['median_s'])} | {ratio(1 / b['ratio_vs_ebm'])} | "
            f"{check(e['figures'], kind)} | {check(f, kind)} | {cost} | {source(run, results_dir, readme)} |"
        )
    return lines


def runs_table(chosen: dict[str, Run], results_dir: Path, readme: Path) -> list[str]:
    """The runs the tables use: command, machine, threads, repeats, versions, load."""
    used: dict[str, Run] = {}
    for run in chosen.values():
        used.setdefault(run.name, run)
    lines = [
        "| results file | workloads used here | date (start) | commit | command | machine, threads, repeats "
        "| versions | load average at start → after the last workload |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in sorted(used.values(), key=lambda r: (r.date, r.name)):
        m = run.meta
        wids = ", ".join(wid for wid, r in chosen.items() if r is run)
        printed = Path(results_dir) / (Path(run.name).stem + ".md")
        name = link(run, results_dir, readme)
        if printed.is_file():
            rel = os.path.relpath(printed, Path(readme).parent).replace(os.sep, "/")
            name += f" (printed output: [`{printed.name}`]({rel}))"
        versions = ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items() if k != "jax_devices")
        modified = modified_code(run)
        cm = commit(run).replace(" + uncommitted changes", "")
        if modified:
            cm += " + uncommitted changes in " + ", ".join(f"`{p}`" for p in modified)
        last = list(run.workloads.values())[-1].get("loadavg_end", "?")
        lines.append(
            f"| {name} | {wids} | {when(run)} | {cm} | `{m.get('command', '?')}` | "
            f"{m.get('machine', '?')}; {plural(m.get('threads', '?'), 'thread')}; {plural(m.get('repeats', '?'), 'repeat')} | "
            f"{versions} | {m.get('loadavg_start', '?')} → {last} |"
        )
    return lines


def render(results_dir: Path = RESULTS_DIR, readme: Path = README) -> str:
    """The generated section, markers included."""
    chosen = latest_per_workload(load_runs(results_dir))
    out = [START, "<!-- Generated by benchmarks/report.py from benchmarks/results/*.json: do not edit by hand. -->", ""]
    if not chosen:
        out += ["No results files in `benchmarks/results/` yet.", "", END]
        return "\n".join(out)
    out += [
        "### All workloads",
        "",
        "The latest run of each workload. Ratios are the peer's median over ebm's (> 1: ebm is faster), "
        "measured in the same run; the number in parentheses beside each timing is its correctness "
        "figure, named in the second-to-last column.",
        "",
    ]
    out += main_table(chosen, results_dir, readme)
    out += [""] + notes(chosen)
    losses = loss_table(chosen, results_dir, readme)
    if losses:
        out += [
            "",
            "### Training losses (W5–W7)",
            "",
            "Time per training step (W5) or per loss + backward call (W6, W7). BlackJAX has no EBM losses.",
            "",
        ]
        out += losses
    bf16 = bf16_table(chosen, results_dir, readme)
    if bf16:
        out += [
            "",
            "### Neural energies in bfloat16 (W4–W7)",
            "",
            "`ebm-bf16`: the same workloads in bfloat16, a separate row, never instead of float32: W4 the fused "
            "chain with bfloat16 products (`precision=\"bf16\"`: the hidden layers' products of bfloat16 operands, "
            "summed in float32; the same Philox draws as float32 ebm), W5–W7 the MLP evaluated under "
            "`autocast=torch.bfloat16` (chains and parameters stay float32). The figures are those of the "
            "tables above (mean energy; loss against its formula); the last column is the cost in accuracy "
            "against float32 ebm on the same draws.",
            "",
        ]
        out += bf16
    nuts = nuts_table(chosen, results_dir, readme)
    if nuts:
        out += ["", "### NUTS (W8)", "", "ESS/s = min bulk ESS over the coordinates / median time; torchebm has no NUTS.", ""]
        out += nuts
    out += ["", "### Runs", ""] + runs_table(chosen, results_dir, readme) + ["", END]
    return "\n".join(out)


def updated(text: str, section: str) -> str:
    """``text`` with everything from the start marker to the end marker replaced by ``section``."""
    i, j = text.find(START), text.find(END)
    if i < 0 or j < i:
        raise ValueError(f"the README lacks the markers {START} ... {END}")
    return text[:i] + section + text[j + len(END) :]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the README is not what this script writes")
    ap.add_argument("--results", type=Path, default=RESULTS_DIR, help="the results directory (default: benchmarks/results)")
    ap.add_argument("--readme", type=Path, default=README, help="the README to update (default: benchmarks/README.md)")
    args = ap.parse_args(argv)
    text = args.readme.read_text(encoding="utf-8")
    try:
        new = updated(text, render(args.results, args.readme))
    except ValueError as exc:
        print(f"{args.readme}: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(f"{args.readme.name} is out of date with the results files: run `python benchmarks/report.py`", file=sys.stderr)
            return 1
        return 0
    if new != text:
        args.readme.write_text(new, encoding="utf-8")
        print(f"updated {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
