"""Held-out log-likelihood of a gaussian_residual run with a mixture base: log Z by importance sampling from the
mixture and by AIS from it (MALA, whitened coordinates), margins over the chosen baselines."""

import json, math, sys, torch
from ebm_losses.train_job import _image_data
from ebm_losses.gaussian_residual import GaussianResidualEnergy
from ebm_losses import likelihood
from ebm_samplers.ais import sigmoid_betas

run = sys.argv[1]  # a run directory of ebm train digits_mixture
torch.manual_seed(0)
spec = dict(dataset="digits", n_train=1500, n_test=297, seed=0, pixel_range=[], dequantize=True)
grid = {}
train, test, pr = _image_data(spec, grid)
ck = torch.load(f"{run}/model.pt", weights_only=False)
m = GaussianResidualEnergy(**ck["params"])
m.load_state_dict(ck["state_dict"])
m.double().eval()
g = lambda z: m.correction.compute_energy(z)
gen = torch.Generator().manual_seed(1)
with torch.no_grad():
    z = m.sample_base(8192, gen, like=torch.zeros(1, dtype=torch.float64))
    lw = -torch.cat([g(c) for c in z.split(1024)])
top = lw.max()
w = (lw - top).exp()
is_ = dict(
    log_z=float(top + w.mean().log()),
    standard_error=float(w.std() / (w.mean() * math.sqrt(len(w)))),
    ess=float(w.sum() ** 2 / (w**2).sum()),
    n=8192,
)


def ais(n_chains, n_temps, seed):
    gen = torch.Generator().manual_seed(seed)
    z = m.sample_base(n_chains, gen, like=torch.zeros(1, dtype=torch.float64))
    betas = sigmoid_betas(n_temps)
    logw = torch.zeros(n_chains, dtype=torch.float64)
    h = 0.1
    acc_all = []

    def eg(z, b):
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            e = m.base_energy(z) + b * g(z)
            (gr,) = torch.autograd.grad(e.sum(), z)
        return e.detach(), gr

    with torch.no_grad():
        gz = g(z)
    for b0, b1 in zip(betas[:-1], betas[1:]):
        logw -= (b1 - b0) * gz
        e, gr = eg(z, b1)
        noise = torch.randn(z.shape, generator=gen, dtype=z.dtype)
        zp = z - h * gr + math.sqrt(2 * h) * noise
        ep, grp = eg(zp, b1)
        lq_f = -((zp - z + h * gr) ** 2).sum(1) / (4 * h)
        lq_b = -((z - zp + h * grp) ** 2).sum(1) / (4 * h)
        la = -ep + e + lq_b - lq_f
        acc = torch.rand(n_chains, generator=gen, dtype=z.dtype).log() < la
        z = torch.where(acc[:, None], zp, z)
        a = float(la.clamp(max=0).exp().mean())
        acc_all.append(a)
        h *= math.exp(0.5 * (a - 0.6))
        with torch.no_grad():
            gz = g(z)
    top = logw.max()
    w = (logw - top).exp()
    return dict(
        log_z=float(top + w.mean().log()),
        standard_error=float(w.std() / (w.mean() * math.sqrt(n_chains))),
        ess=float(w.sum() ** 2 / (w**2).sum()),
        acceptance=sum(acc_all) / len(acc_all),
        n_chains=n_chains,
        n_temperatures=n_temps,
    )


a300, a150 = ais(128, 300, 2), ais(128, 150, 3)
with torch.no_grad():
    e = m.compute_energy(test.double()).double()
model = -e - a300["log_z"]
baselines, per_point = likelihood.chosen_baselines(train.double(), test.double(), (-1.0, 1.0), step=grid["step"], seed=0)
with torch.no_grad():
    per_point["own_mixture_base_g0"] = -(m.base_energy(m.whiten(test.double())) + m.log_normalizer()).double()
margins = likelihood.margins(model, a300["standard_error"], per_point)
agree = lambda p, q: abs(p["log_z"] - q["log_z"]) <= 3 * math.hypot(p["standard_error"], q["standard_error"]) + 1e-3
reliable = agree(a300, is_) and agree(a300, a150) and a300["ess"] >= 12.8 and is_["ess"] >= 0.1 * 8192
out = dict(
    test_log_likelihood=float(model.mean()),
    test_mean_se=float(model.std() / math.sqrt(len(model))),
    bits_per_dim=likelihood.bits_per_dim(float(model.mean()), 64, grid["step"]),
    log_z=dict(ais_300=a300, ais_150=a150, importance_sampling_from_mixture=is_),
    margins=margins,
    reliable=reliable,
    baselines={
        k: {kk: v[kk] for kk in ("log_likelihood", "standard_error") if kk in v}
        | ({"components": v["components"]} if "components" in v else {})
        for k, v in baselines.items()
    },
    method="log Z by importance sampling (8192 exact draws of the model's mixture base) and by AIS from that base (MALA in whitened coordinates, 128 chains, 300 and 150 sigmoid temperatures); reliable: AIS 300 agrees with IS and AIS 150 (3 combined SE + 0.001), AIS ESS >= 10%, IS ESS >= 10%",
    script="mixture_density.py",
)
json.dump(out, open(f"{run}/mixture_density.json", "w"), indent=1)
print(
    json.dumps({k: out[k] for k in ("test_log_likelihood", "test_mean_se", "reliable")}, indent=0),
    json.dumps(out["log_z"]),
    json.dumps(margins),
)
