"""What a run records about its chains: which went non-finite, and the diagnostics of the others."""

import torch

from ebmcore import diagnostics
from ebmcore.recording import finite_summary, nonfinite_chains


def test_finite_summary_diagnoses_the_chains_that_stayed_finite():
    x = torch.randn(50, 6, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x[30:, 2, 1] = float("nan")
    x[10, 4, 0] = float("inf")
    assert nonfinite_chains(x, dim=1).tolist() == [2, 4] and nonfinite_chains(x[-1]).tolist() == [2]
    got, want = finite_summary(x), diagnostics.summary(x[:, [0, 1, 3, 5]])
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert finite_summary(x[:, [2, 4]]) == {} and finite_summary(x[:3]) == {}  # no finite chain; too few draws
