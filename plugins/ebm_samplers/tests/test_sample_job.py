"""`ebm sample` and `ebm profile` end to end: files, metrics, plots, validation, streaming, memory."""

import json
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from ebmcore.cli import main

SMALL = """
[energy]
name = "gaussian_mixture"
params = { means = [[-1.0, 0.0], [1.0, 0.0]], stds = 0.8 }

[sampler]
name = "{sampler}"
n_chains = 200
n_steps = 100
burn_in = 50
warmup = {warmup}
target_accept = 0.7

[output]
plots = {plots}
"""


def _config(tmp_path, sampler="mala", warmup=60, plots="true", extra=""):
    path = tmp_path / "sample.toml"
    path.write_text(SMALL.replace("{sampler}", sampler).replace("{warmup}", str(warmup)).replace("{plots}", plots) + extra)
    return path


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("sampler", ["mala", "nuts", "langevin"])
def test_sample_writes_samples_metrics_and_plots(tmp_path, capsys, sampler):
    out = tmp_path / "run"
    assert (
        main(["sample", str(_config(tmp_path, sampler, warmup=60 if sampler != "langevin" else 0)), "--out", str(out), "--quiet"])
        == 0
    )
    assert "metrics:" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n_chains"] == 200 and metrics["n_kept"] == 100
    assert metrics["ess_bulk_min"] > 50
    if sampler != "langevin":  # ULA at its small default step has not mixed across the modes in 150 steps
        assert metrics["r_hat_max"] < 1.1
    assert metrics["kernel_backends"]["gaussian_mixture_gradient"] == "torch"
    if sampler != "langevin":
        assert 0.4 < metrics["acceptance"] < 0.95 and metrics["divergences"] == 0
    samples = torch.load(out / "samples.pt")
    assert samples.shape == (200, 2) and torch.isfinite(samples).all()
    import numpy as np

    assert np.load(out / "samples.npz")["samples"].shape == (200, 2)
    for name in ("landscape.png", "trace.png", "autocorrelation.png"):
        width, height = png_size(out / name)
        assert width > 300 and height > 200
    _check_draws(out, sampler, metrics, samples)


def _check_draws(out, sampler, metrics, samples):
    """draws.npz, read with numpy alone: the kept draws and their statistics under ArviZ's names."""
    import numpy as np

    import ebmcore

    with np.load(out / "draws.npz", allow_pickle=False) as f:
        d = dict(f)
    expected = {
        "langevin": {"lp", "step_size"},
        "mala": {"lp", "step_size", "acceptance_rate", "diverging"},
        "nuts": {"lp", "step_size", "acceptance_rate", "diverging", "energy", "tree_depth", "n_steps"},
    }[sampler]
    metric = {"metric_diagonal"} if sampler == "nuts" else set()  # the diagonal inverse mass the warm-up adapted
    assert set(d) == expected | metric | {"x", "attrs"}
    assert ("metric" in json.loads(str(d["attrs"]))) == bool(metric) and all(d[k].shape == (2,) for k in metric)
    assert d["x"].shape == (100, 200, 2) and np.array_equal(d["x"][-1], samples.numpy())  # the last draw: the samples
    assert all(d[k].shape == (100, 200) for k in expected)
    energy = ebmcore.energy("gaussian_mixture", means=[[-1.0, 0.0], [1.0, 0.0]], stds=0.8)
    np.testing.assert_allclose(d["lp"], -energy.energy(torch.from_numpy(d["x"]).flatten(0, 1)).view(100, 200).numpy(), rtol=1e-5)
    np.testing.assert_allclose(d["step_size"].mean(), metrics["step_size"], rtol=1e-6)
    assert json.loads(str(d["attrs"]))["sampler"] == sampler
    if "diverging" in d:  # thin = 1: every transition after burn-in made a draw
        assert d["diverging"].dtype == bool and int(d["diverging"].sum()) == metrics["divergences"]
    if sampler == "nuts":  # NUTS's acceptance is its acceptance statistic, averaged per chain in the metrics
        np.testing.assert_allclose(d["acceptance_rate"].mean(), metrics["acceptance"], rtol=1e-5)
        assert d["tree_depth"].min() >= 1 and d["n_steps"].min() >= 1


@pytest.mark.parametrize(
    "extra, message",
    [
        ("[run]\nnsamples = 3\n", "unknown key(s) nsamples"),
        ("[run]\nseed = 'x'\n", "key 'seed' must be int"),
        ("[run]\nchunk_size = 0\n", "key 'chunk_size' must be > 0"),
    ],
)
def test_config_errors_name_the_key_and_file(tmp_path, capsys, extra, message):
    assert main(["sample", str(_config(tmp_path, extra=extra)), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and "sample.toml" in err
    assert not (tmp_path / "o").exists()  # validated before any work


def test_unknown_sampler_and_bad_energy_table(tmp_path, capsys):
    assert main(["sample", str(_config(tmp_path, sampler="nutz")), "--quiet"]) == 2
    assert "Did you mean 'nuts'" in capsys.readouterr().err
    path = tmp_path / "both.toml"
    path.write_text('[energy]\nname = "gaussian"\nmodel = "m.pt"\n')
    assert main(["sample", str(path), "--quiet"]) == 2
    assert "either 'name'" in capsys.readouterr().err


def test_streaming_chunks_and_resume(tmp_path):
    cfg = _config(tmp_path, "langevin", warmup=0, plots="false")
    out = tmp_path / "stream"
    args = ["sample", str(cfg), "--out", str(out), "--n-samples", "2500", "--chunk-size", "1000", "--quiet"]
    assert main(args) == 0
    chunks = sorted((out / "chunks").glob("*.npz"))
    assert [c.name for c in chunks] == ["chunk-00000.npz", "chunk-00001.npz", "chunk-00002.npz"]
    import numpy as np

    first = np.load(chunks[1])["samples"]
    assert np.load(chunks[2])["samples"].shape == (500, 2)
    assert (
        main(args) == 0 and (out / "chunks" / "chunk-00001.npz").stat().st_mtime_ns == chunks[1].stat().st_mtime_ns
    )  # finished: nothing to do
    chunks[1].unlink()  # a chunk missing: the run is not finished
    assert main(args) == 2  # chunks exist: refuses to overwrite without --resume
    assert main(args + ["--resume"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["chunks_written"] == 1 and metrics["chunks_resumed"] == 2
    assert np.array_equal(np.load(chunks[1])["samples"], first)  # each chunk is reproducible from (seed, chunk)
    assert not (out / "draws.npz").exists()  # a stream keeps each chunk's final states only


def _peak_rss_mb(tmp_path, n_samples):
    cfg = tmp_path / "memory.toml"
    cfg.write_text(
        '[energy]\nname = "double_well"\n[sampler]\nname = "langevin"\nn_steps = 1\nburn_in = 0\n[output]\nplots = false\n'
    )
    code = textwrap.dedent(f"""
        import resource
        from ebmcore.cli import main
        assert main(["sample", {str(cfg)!r}, "--out", {str(tmp_path / f"m{n_samples}")!r},
                     "--n-samples", "{n_samples}", "--chunk-size", "100000", "--quiet"]) == 0
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def test_streaming_keeps_peak_memory_flat(tmp_path):
    """8x the samples (3.2 M × 2 float32 = 26 MB if they were held) must not raise the peak resident memory by 12 MB."""
    small, large = _peak_rss_mb(tmp_path, 400_000), _peak_rss_mb(tmp_path, 3_200_000)
    assert large - small < 12, f"peak RSS {small:.0f} MB -> {large:.0f} MB"


def test_streamed_chunks_keep_memory_flat_over_many_chunks(tmp_path):
    """stream_chunks itself, MALA with its acceptance counted over every step: the resident memory after 3N chunks
    (each 10000 x 50 float32, 2 MB) is where it was after N. The floor over the last chunks is compared, since
    the allocator's cached memory makes single readings, and the peak, wander by some 20 MB either way."""
    code = textwrap.dedent(f"""
        from pathlib import Path
        import torch
        import ebmcore
        from ebmcore.chunks import stream_chunks
        from ebm_samplers import MALASampler
        torch.set_num_threads(1)
        rss = []
        def initial(size, g):  # called at the start of every chunk
            rss.append(int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20)
            return torch.randn(size, 50, generator=g)
        sampler = MALASampler(ebmcore.energy("gaussian", dim=50), step_size=0.3)
        metrics = stream_chunks(sampler, 19 * 10000, 10000, 10, Path({str(tmp_path)!r}), initial=initial, seed=0,
                                device=torch.device("cpu"))
        assert metrics["chunks_written"] == 19 and 0.3 < metrics["acceptance"] < 1
        print(min(rss[3:7]), min(rss[15:19]))  # after N = 6 chunks and after 3N = 18
    """)
    # glibc's malloc raises its mmap threshold after freeing a large block, and then keeps later 2 MB buffers on its
    # heap, where the memory may stay resident: in about one run in three the floor rose 25 MB with nothing held.
    # A fixed threshold returns every buffer to the system, so what stays resident is what the code holds.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    after_n, after_3n = map(float, done.stdout.split())
    assert after_3n - after_n < 4, f"resident memory {after_n:.0f} MB after 6 chunks, {after_3n:.0f} MB after 18"
    assert len(list(tmp_path.glob("chunk-*.npz"))) == 19


def test_profile_prints_a_breakdown(tmp_path, capsys):
    assert main(["profile", str(_config(tmp_path)), "--n-chains", "100", "--n-steps", "10"]) == 0
    out = capsys.readouterr().out
    assert "ms per step" in out and "energy and gradient" in out and "random numbers" in out


@pytest.mark.parametrize(
    "extra, line",
    [
        (9.0e-5, "diagnostics (when recorded)     +0.090 ms  +52.9 % on top of a step"),
        (0.0, "diagnostics (when recorded)  not measurable: a run recording them was no slower, within the timing noise"),
    ],
)
def test_profile_says_whether_the_diagnostics_cost_was_measured(extra, line):
    # a share of the step's time for a phase that is not part of it, or 0.0 % when it was not measured, misled
    from ebm_samplers.profiling import _diagnostics, format_profile

    result = {
        "total": 1.7e-4,
        "energy_gradient": 1e-4,
        "rng": 5e-5,
        "update_acceptance": 2e-5,
        "gradient_evaluations": 1.0,
        **_diagnostics(extra),
    }
    printed = format_profile("mala", 50, result).splitlines()
    assert printed[-1] == f"  {line}"
    assert result["diagnostics_measured"] is (extra > 0) and _diagnostics(-1e-5) == {
        "diagnostics": 0.0,
        "diagnostics_measured": False,
    }


def test_profile_function():
    import ebmcore
    from ebm_samplers import HMCSampler
    from ebm_samplers.profiling import profile

    result = profile(
        HMCSampler(ebmcore.energy("gaussian", dim=3), step_size=0.1, n_leapfrog_steps=4), torch.randn(100, 3), 10, repeats=2
    )
    assert result["gradient_evaluations"] == pytest.approx(4 + 1 / 10)  # L per step, plus the one at x0
    assert result["total"] > 0 and result["energy_gradient"] > 0
    # HMC on a Gaussian runs as a fused chain exactly when a backend (ebm-cuda's cpu_fused) provides one
    has_chain = any("gaussian_hmc_chain" in e.component.kernels for e in ebmcore.registry.entries("kernel"))
    assert (result["fused_total"] is not None and result["fused_total"] > 0) if has_chain else result["fused_total"] is None


@pytest.mark.parametrize(
    "extra, message",
    [
        ('[run]\ndevice = "cuda:7"\n', "is not available"),
        ('[run]\ndevice = "potato"\n', "is not a device"),
    ],
)
def test_device_and_params_are_checked_before_any_work(tmp_path, capsys, extra, message):
    assert main(["sample", str(_config(tmp_path, extra=extra)), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "o").exists()
    bad = tmp_path / "bad.toml"
    bad.write_text('[energy]\nname = "gaussian"\nparams = { dim = 2, colour = "red" }\n')
    assert main(["sample", str(bad), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert "[energy]" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_few_kept_draws_still_summarise(tmp_path, capsys):
    assert main(["sample", str(_config(tmp_path, plots="false")), "--out", str(tmp_path / "o"), "--n-steps", "3", "--quiet"]) == 0
    assert "3 kept draws" in capsys.readouterr().out


def test_an_interrupted_sampling_run_resumes_exactly(tmp_path, monkeypatch):
    from ebm_samplers import sample_job

    cfg = _config(tmp_path, "mala", warmup=30, plots="false", extra="[run]\ncheckpoint_every = 20\n")
    assert main(["sample", str(cfg), "--out", str(tmp_path / "straight"), "--quiet"]) == 0
    # every file the run wrote loads without unpickling code: samples, checkpoint, segments
    written = {
        path.relative_to(tmp_path / "straight").as_posix()
        for path in (tmp_path / "straight").rglob("*.pt")
        if torch.load(path, weights_only=True) is not None
    }
    assert written == {"samples.pt", "checkpoint.pt", *(f"segments/segment-0000{i}.pt" for i in range(5))}

    def interrupt(index):
        if index == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(sample_job, "_after_segment", interrupt)
    assert main(["sample", str(cfg), "--out", str(tmp_path / "cut"), "--quiet"]) == 130  # interrupted
    monkeypatch.setattr(sample_job, "_after_segment", lambda index: None)
    assert main(["sample", str(cfg), "--out", str(tmp_path / "cut"), "--quiet"]) == 2  # a checkpoint exists: needs --resume
    assert main(["sample", str(cfg), "--out", str(tmp_path / "cut"), "--resume", "--quiet"]) == 0
    assert torch.equal(torch.load(tmp_path / "straight" / "samples.pt"), torch.load(tmp_path / "cut" / "samples.pt"))
    from ebm_samplers.draws import load_npz

    straight, cut = load_npz(tmp_path / "straight" / "draws.npz"), load_npz(tmp_path / "cut" / "draws.npz")
    assert torch.equal(straight.x, cut.x) and straight.stats.keys() == cut.stats.keys() == {
        "lp",
        "acceptance_rate",
        "diverging",
        "step_size",
    }
    assert all(torch.equal(v, cut.stats[k]) for k, v in straight.stats.items())
    a = json.loads((tmp_path / "straight" / "metrics.json").read_text())
    b = json.loads((tmp_path / "cut" / "metrics.json").read_text())
    for key in ("ess_bulk_min", "r_hat_max", "acceptance", "divergences", "mean"):
        assert a[key] == b[key], key
    unsegmented = _config(tmp_path, "mala", warmup=30, plots="false")
    assert main(["sample", str(unsegmented), "--out", str(tmp_path / "one"), "--quiet"]) == 0
    assert torch.equal(torch.load(tmp_path / "one" / "samples.pt"), torch.load(tmp_path / "straight" / "samples.pt"))


def test_the_schema_defaults_are_the_bundled_configuration():
    from ebmcore.config import read_toml
    from ebm_samplers import sample_job

    bundled = read_toml(sample_job.default_config_path())
    for table, rules in sample_job.SCHEMA.items():
        for key, (_, default) in rules.items():
            if table != "energy" and key in bundled.get(table, {}):
                assert bundled[table][key] == default, f"[{table}] {key}: bundled {bundled[table][key]!r}, schema {default!r}"


def test_a_given_step_size_runs_as_given_and_the_report_says_where_it_came_from(tmp_path, capsys):
    cfg = _config(tmp_path, "mala", warmup=60, plots="false")
    given = lambda *flags: main(["sample", str(cfg), "--out", str(tmp_path / "-".join(flags or ("x",))), "--quiet", *flags])  # noqa: E731
    read = lambda *flags: json.loads((tmp_path / "-".join(flags or ("x",)) / "metrics.json").read_text())  # noqa: E731
    assert given("--step-size", "0.3") == 0
    m = read("--step-size", "0.3")
    assert m["step_size"] == 0.3 and m["step_size_source"] == "given"
    assert "step size 0.3: given" in capsys.readouterr().out
    assert given("--step-size", "0.3", "--warmup", "40") == 0  # warm-up asked for: adapted from the given step
    m = read("--step-size", "0.3", "--warmup", "40")
    assert (
        m["step_size"] != 0.3
        and m["step_size_source"].startswith("adapted by 40 warm-up steps")
        and "0.3" in m["step_size_source"]
    )
    assert given() == 0  # the configuration's warm-up from the default step
    assert read()["step_size_source"].startswith("adapted by 60 warm-up steps (target acceptance 0.7) from the default")
    assert main(["sample", str(_config(tmp_path, "mala", warmup=0, plots="false")), "--out", str(tmp_path / "d"), "--quiet"]) == 0
    m = json.loads((tmp_path / "d" / "metrics.json").read_text())
    assert m["step_size_source"] == "the default of mala for d = 2" and m["step_size"] == pytest.approx(0.5 * 2 ** (-1 / 3))


def test_without_matplotlib_the_plots_are_skipped_with_one_line(tmp_path, capsys, monkeypatch):
    from ebmcore import plotting

    monkeypatch.setattr(plotting, "unavailable", lambda: "matplotlib is not installed (pip install 'ebmcore[plot]')")
    assert main(["sample", str(_config(tmp_path, "mala", warmup=0)), "--out", str(tmp_path / "o")]) == 0
    assert "plots skipped: matplotlib is not installed" in capsys.readouterr().err
    assert (tmp_path / "o" / "metrics.json").exists() and not list((tmp_path / "o").glob("*.png"))


def test_checkpointing_refuses_what_it_cannot_resume_exactly(tmp_path):
    import ebmcore
    from ebm_samplers import AnnealedLangevinSampler, MALASampler
    from ebmcore.chunks import sample_in_segments
    from ebmcore.errors import InputError

    energy, x0, g = ebmcore.energy("gaussian", dim=2), torch.randn(8, 2), torch.Generator().manual_seed(0)
    with pytest.raises(InputError, match=r"keeps more than its positions in its state \(n_taken, x\)"):
        sample_in_segments(AnnealedLangevinSampler(energy, [1.0, 0.1], n_steps_each=5), x0, 10, 2, tmp_path, generator=g)
    with pytest.raises(InputError, match=r"n_steps \(3\) must be at least thin \(4\)"):
        sample_in_segments(MALASampler(energy), x0, 3, 2, tmp_path, thin=4, generator=g)


DIVERGING = """
[energy]
name = "double_well"
params = { dim = 2 }

[sampler]
name = "langevin"
n_chains = 64
n_steps = 20
burn_in = 0
warmup = 0
params = { step_size = 0.12 }
"""


def test_diverging_chains_are_counted_named_and_left_out_and_the_run_finishes(tmp_path, capsys):
    cfg = tmp_path / "diverging.toml"
    cfg.write_text(DIVERGING)
    assert main(["sample", str(cfg), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    samples = torch.load(tmp_path / "run" / "samples.pt")
    bad = (~torch.isfinite(samples).all(1)).nonzero().flatten().tolist()
    assert 0 < len(bad) < 64 and metrics["nonfinite_chains"] == len(bad) and metrics["nonfinite_chain_indices"] == bad
    finite = samples[torch.isfinite(samples).all(1)].double()
    assert metrics["mean"] == pytest.approx(finite.mean(0).tolist(), rel=1e-12)
    assert metrics["ess_bulk_min"] > 0 and metrics["r_hat_max"] > 0  # the diagnostics of the finite chains
    for name in ("landscape.png", "trace.png", "autocorrelation.png"):
        png_size(tmp_path / "run" / name)
    captured = capsys.readouterr()
    assert f"{len(bad)} of 64 chains went non-finite (chains {bad[:10]}" in captured.out
    assert captured.err.startswith(f"warning: LangevinSampler: {len(bad)} of 64 chains became non-finite")  # one line
    assert main(["sample", str(cfg), "--out", str(tmp_path / "strict"), "--quiet", "--strict"]) == 1
    assert f"error: --strict: {len(bad)} of 64 chains went non-finite" in capsys.readouterr().err
    assert json.loads((tmp_path / "strict" / "metrics.json").read_text())["nonfinite_chain_indices"] == bad


def test_a_stream_of_diverging_chains_counts_and_names_them(tmp_path, capsys):
    import numpy as np

    cfg = tmp_path / "diverging.toml"
    cfg.write_text(DIVERGING)
    args = ["sample", str(cfg), "--out", str(tmp_path / "s"), "--n-samples", "130", "--chunk-size", "50", "--quiet"]
    assert main(args + ["--strict"]) == 1
    streamed = np.concatenate([np.load(p)["samples"] for p in sorted((tmp_path / "s" / "chunks").glob("chunk-*.npz"))])
    bad = np.flatnonzero(~np.isfinite(streamed).all(1)).tolist()
    metrics = json.loads((tmp_path / "s" / "metrics.json").read_text())
    assert streamed.shape == (130, 2) and bad and metrics["nonfinite_chains"] == len(bad)
    assert metrics["nonfinite_chain_indices"] == bad
    assert f"{len(bad)} of 130 chains went non-finite" in capsys.readouterr().out
    (tmp_path / "s" / "chunks" / "chunk-00002.npz").unlink()  # resumed: the chunks kept still count
    (tmp_path / "s" / "metrics.json").unlink()
    assert main(args + ["--resume"]) == 0
    metrics = json.loads((tmp_path / "s" / "metrics.json").read_text())
    assert metrics["chunks_resumed"] == 2 and metrics["nonfinite_chain_indices"] == bad


def test_a_finished_run_is_not_run_again_unless_overwritten(tmp_path, capsys):
    cfg = _config(tmp_path, "mala", warmup=0, plots="false", extra="[run]\ncheckpoint_every = 50\n")
    out = tmp_path / "run"
    assert main(["sample", str(cfg), "--out", str(out), "--quiet"]) == 0
    first = capsys.readouterr().out
    written = (out / "metrics.json").stat().st_mtime_ns
    assert main(["sample", str(cfg), "--out", str(out)]) == 0  # as `make demo` run twice does
    captured = capsys.readouterr()
    assert "holds a finished run of this configuration, summarised below: nothing to do (pass --overwrite" in captured.err
    assert captured.out == first and (out / "metrics.json").stat().st_mtime_ns == written
    assert main(["sample", str(cfg), "--out", str(out), "--quiet", "--resume"]) == 0  # resuming a finished run: the same
    assert (out / "metrics.json").stat().st_mtime_ns == written
    assert main(["sample", str(cfg), "--out", str(out), "--quiet", "--n-steps", "60"]) == 2  # another configuration
    assert "checkpoint.pt exists: pass --resume to continue that run, --overwrite to start it afresh" in capsys.readouterr().err
    assert main(["sample", str(cfg), "--out", str(out), "--quiet", "--overwrite"]) == 0
    assert "nothing to do" not in capsys.readouterr().err and (out / "metrics.json").stat().st_mtime_ns != written
    assert main(["sample", str(cfg), "--out", str(out), "--quiet", "--overwrite", "--resume"]) == 2


class PickledCode:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def _interrupted(tmp_path, monkeypatch):
    """A checkpointed run stopped after its first segment."""
    from ebm_samplers import sample_job

    cfg = _config(tmp_path, "mala", warmup=0, plots="false", extra="[run]\ncheckpoint_every = 40\n")

    def stop(index):
        raise KeyboardInterrupt

    monkeypatch.setattr(sample_job, "_after_segment", stop)
    assert main(["sample", str(cfg), "--out", str(tmp_path / "cut"), "--quiet"]) == 130
    monkeypatch.setattr(sample_job, "_after_segment", lambda index: None)
    return cfg


def _truncate(path):
    path.write_bytes(path.read_bytes()[:200])


@pytest.mark.parametrize(
    "case, message",
    [
        ("out is a file", "the run directory {tmp}/afile is an existing file; choose a directory (--out)"),
        ("not utf-8", "bad.toml: not UTF-8 text (byte b'\\xff' at offset"),
        ("seed beyond 64 bits", "[run]: key 'seed' must be in [0, 2**64)"),
        (
            "too many kept draws",
            "n_steps = 100000000000 // thin = 1 kept draws of n_chains = 200 chains of shape (2,) need about",
        ),
        ("truncated model", "model.pt cannot be read as a model from ebm train"),
        ("not a model", "model.pt is not a model from ebm train"),
        (
            "pickled code in the model",
            "model.pt holds pickled Python objects, which ebm never loads (it expected a model from ebm train)",
        ),
        (
            "wrong keyword",
            "[energy]: energy 'gaussian_mixture' (GaussianMixtureEnergy): got an unexpected keyword argument 'sd'; it takes means, stds",
        ),
        (
            "missing segment",
            "segment-00000.pt: no such file (expected segment 0 of the checkpointed run); start the run again with --overwrite",
        ),
        ("truncated checkpoint", "checkpoint.pt cannot be read as a sampling checkpoint"),
        ("full disk", "cannot write {tmp}/o/samples.pt: No space left on device (errno 28); free some space"),
        ("read-only directory", "cannot write {tmp}/o/config.json: Permission denied (errno 13); make {tmp}/o writable"),
    ],
)
def test_bad_inputs_and_files_are_errors_not_tracebacks(tmp_path, monkeypatch, capsys, case, message):
    import errno

    from ebmcore import runfiles

    cfg, out, extra = _config(tmp_path, "mala", warmup=0, plots="false"), tmp_path / "o", []
    if case == "out is a file":
        out = tmp_path / "afile"
        out.write_text("")
    elif case == "not utf-8":
        cfg = tmp_path / "bad.toml"
        cfg.write_bytes(b'[energy]\nname = "gau\xffssian"\n')
    elif case == "seed beyond 64 bits":
        extra = ["--seed", str(2**64)]
    elif case == "too many kept draws":
        extra = ["--n-steps", str(10**11)]
    elif case == "pickled code in the model":  # loaded with weights_only=True: the pickled object is refused, not run
        torch.save({"energy": "mlp", "params": {}, "state_dict": {}, "code": PickledCode()}, tmp_path / "model.pt")
        cfg.write_text(f'[energy]\nmodel = "{tmp_path / "model.pt"}"\n')
    elif case in ("truncated model", "not a model"):
        torch.save(
            {"energy": "mlp", "params": {}, "state_dict": {"w": torch.zeros(1000)}}
            if case == "truncated model"
            else torch.zeros(3),
            tmp_path / "model.pt",
        )
        if case == "truncated model":
            _truncate(tmp_path / "model.pt")
        cfg.write_text(f'[energy]\nmodel = "{tmp_path / "model.pt"}"\n')
    elif case == "wrong keyword":
        cfg.write_text(cfg.read_text().replace("stds = 0.8", "sd = 0.8"))
    elif case in ("missing segment", "truncated checkpoint"):
        cfg, out, extra = _interrupted(tmp_path, monkeypatch), tmp_path / "cut", ["--resume"]
        if case == "missing segment":
            (out / "segments" / "segment-00000.pt").unlink()
        else:
            _truncate(out / "checkpoint.pt")
    elif case == "full disk":
        real = runfiles._write

        def full(tmp, data):
            if tmp.name.startswith("samples"):
                raise OSError(errno.ENOSPC, "No space left on device")
            real(tmp, data)

        monkeypatch.setattr(runfiles, "_write", full)
    elif case == "read-only directory":  # as chmod 555 does for a user other than root

        def refused(tmp, data):
            raise PermissionError(errno.EACCES, "Permission denied")

        monkeypatch.setattr(runfiles, "_write", refused)
    capsys.readouterr()
    assert main(["sample", str(cfg), "--out", str(out), "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    assert message.replace("{tmp}", str(tmp_path)) in err
    if case == "read-only directory":
        assert list(out.iterdir()) == []
    if case == "full disk":  # what was written before is whole, and no temporary is left behind
        assert json.loads((out / "config.json").read_text())["sampler"]["n_chains"] == 200
        assert sorted(p.name for p in out.iterdir()) == ["config.json", "draws.npz"]  # draws.npz comes before samples
        assert np.load(out / "draws.npz")["x"].shape[1] == 200


def test_chees_warms_up_with_its_own_adaptation_in_ebm_sample(tmp_path, capsys, monkeypatch):
    """``[sampler] name = "chees"`` runs ChEES's warm-up (step size and trajectory length), not the generic one."""
    from ebm_samplers import chees_adaptation

    seen = []
    real = chees_adaptation.chees_warmup
    monkeypatch.setattr(chees_adaptation, "chees_warmup", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    assert (
        main(["sample", str(_config(tmp_path, "chees", warmup=60, plots="false")), "--out", str(tmp_path / "c"), "--quiet"]) == 0
    )
    m = json.loads((tmp_path / "c" / "metrics.json").read_text())
    (tuned,) = seen
    assert m["step_size_source"].startswith(
        "adapted by 60 chees warm-up steps (target acceptance 0.7; its step size and trajectory"
    )
    assert m["step_size"] == pytest.approx(tuned.step_size) and tuned.trajectory_lengths[0] != tuned.trajectory_length
    assert m["r_hat_max"] < 1.1
    cfg = _config(tmp_path, "chees", warmup=60, plots="false")
    cfg.write_text(cfg.read_text().replace("target_accept = 0.7", 'target_accept = 0.7\nmetric = "dense"'))
    assert main(["sample", str(cfg), "--out", str(tmp_path / "d"), "--quiet"]) == 2
    assert "chees's warm-up adapts its step size and trajectory length, not a mass matrix" in capsys.readouterr().err
    cfg.write_text(cfg.read_text().replace('name = "chees"', 'name = "meads"').replace('metric = "dense"\n', ""))
    assert main(["sample", str(cfg), "--out", str(tmp_path / "m"), "--quiet"]) == 0
    m = json.loads((tmp_path / "m" / "metrics.json").read_text())
    assert m["step_size_source"].startswith("adapted by 60 meads warm-up steps (its step size, damping and diagonal mass")
