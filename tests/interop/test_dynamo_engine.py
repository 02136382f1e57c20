"""The lab's scheduler and timing model against Dynamo 1.6.1's own mocker engine, under its
`vllm` and `trtllm` policies (the lab's `trtllm` with `first_token_decode` off, as Dynamo's),
both on a simulated clock (Dynamo's offline replay runs the Rust scheduler that `python -m
dynamo.mocker` runs live): the same TTFT and per-request inter-token time, within
0.5%, at c=1/32/128 for ISL 136/OSL 128 and ISL 1024/OSL 64 (docs/mocker.md
"Engine against engine"). So what `lab fidelity` finds between the live stacks is not the
engine model: it is the serving paths and the calibration.
"""

from __future__ import annotations

import pytest

from tests.interop import closed_loop as cl
from tests.interop import dynamo_stack as dyn
from tests.interop.test_dynamo_sidecar import _venv_or_skip

TOLERANCE = 0.005


@pytest.mark.parametrize("policy", sorted(cl.POLICIES))
@pytest.mark.parametrize(("isl", "osl"), cl.WORKLOADS)
@pytest.mark.parametrize("conc", cl.LEVELS)
def test_lab_engine_matches_dynamo_engine(policy: str, isl: int, osl: int, conc: int) -> None:
    _venv_or_skip()
    lab_args, dyn_args = cl.POLICIES[policy]
    n = cl.requests_for(conc)
    ref = cl.dynamo_closed_loop(dyn.python(), isl, osl, conc, n, dyn_args)
    lab = cl.lab_closed_loop(isl, osl, conc, n, lab_args)
    for name in ("median_ttft_ms", "mean_ttft_ms", "median_tpot_ms", "duration_ms"):
        d, m = getattr(ref, name), getattr(lab, name)
        assert abs(cl.gap(m, d)) <= TOLERANCE, (
            f"{policy} c={conc} ISL {isl}/OSL {osl}: {name} lab {m:.3f} vs Dynamo {d:.3f} "
            f"({100 * cl.gap(m, d):+.2f}%)")
