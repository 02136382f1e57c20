"""plots/fit.png of `lab calibrate`: the fitted profile over its knots, with the built-in
polynomial model (the uncalibrated default) beside it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from lab.fidelity.fit import Fit
from lab.fidelity.probes import ProbeResult
from lab.report.plots import _save
from mocker.engine.config import EngineArgs
from mocker.engine.timing import TimingModel


def fit_plot(fit: Fit, results: Sequence[ProbeResult], path: Path) -> Path:
    default = TimingModel(EngineArgs(engine_type=fit.engine_type))
    fig, (ax_p, ax_d) = plt.subplots(1, 2, figsize=(11, 4.5))
    xs = np.array([k.tokens for k in fit.prefill])
    grid = np.linspace(1, max(xs.max() * 1.1, 2), 200)
    ax_p.plot(grid, [fit.prefill_ms(t) for t in grid], "-", color="tab:blue",
              label="fitted profile (lab mocker)")
    ax_p.plot(xs, [k.ms for k in fit.prefill], "o", color="tab:blue", label="knots")
    ax_p.plot(xs, [k.raw_ms for k in fit.prefill], "x", color="tab:red",
              label="measured: overlap gap (or c=1 TTFT)")
    ax_p.plot(grid, [default.unscaled_prefill_ms(int(t)) for t in grid], "--", color="gray",
              label="built-in polynomial")
    ax_p.set(title="Prefill", xlabel="new prompt tokens in the pass", ylabel="ms")
    ax_p.legend(fontsize=8)
    xd = np.array([k.tokens for k in fit.decode])
    gd = np.geomspace(max(xd.min() / 1.5, 1), xd.max() * 1.5, 200)
    ax_d.plot(gd, [fit.decode_ms(t) for t in gd], "-", color="tab:green",
              label="fitted profile (lab mocker)")
    ax_d.plot(xd, [k.ms for k in fit.decode], "o", color="tab:green",
              label="knots (token gaps without prefill)")
    ax_d.plot(gd, [default.unscaled_decode_ms(int(t)) for t in gd], "--", color="gray",
              label="built-in polynomial")
    ax_d.set(title="Decode step", xlabel="active KV tokens", ylabel="ms", xscale="log")
    ax_d.legend(fontsize=8)
    return _save(fig, path)
