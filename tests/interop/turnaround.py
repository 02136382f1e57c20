"""How a closed loop's turnaround sets TTFT: `python -m tests.interop.turnaround`.

The lab's engine (Dynamo's model, `{"engine_type": "vllm"}`) on a simulated clock under a
closed loop whose finished requests' successors reach the engine `turnaround` ms after the
pass that finished them: the path back to the client, the client's resend and the path to the
engine, as one number. A successor that arrives within the pass after its predecessor's last
joins the one after; one that arrives later waits for a whole pass more, and a closed loop
keeps such a shift generation after generation. The table shows at which turnaround each
level's TTFT p50 changes mode (docs/fidelity.md "The closed loop's turnaround"). Simulated
time: the figures do not depend on the machine.
"""

from __future__ import annotations

from tests.interop.closed_loop import lab_closed_loop

#: (ISL, OSL, concurrency): the fidelity workloads at the levels where a live gap was measured
LEVELS = ((136, 128, 32), (136, 128, 128), (1024, 64, 32), (1024, 64, 128))
TURNAROUNDS_MS = (0.5, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0)
#: closed-loop generations per run, after the warm-up wave
GENERATIONS = 6


def main() -> None:
    print("| ISL/OSL | c | turnaround ms | TTFT p50 ms | TTFT mean ms | TPOT p50 ms |")
    print("|---|---|---|---|---|---|")
    for isl, osl, conc in LEVELS:
        for d in TURNAROUNDS_MS:
            s = lab_closed_loop(isl, osl, conc, conc * (GENERATIONS + 1), turnaround_ms=d,
                                warmup=conc)
            print(f"| {isl}/{osl} | {conc} | {d:g} | {s.median_ttft_ms:.1f} | "
                  f"{s.mean_ttft_ms:.1f} | {s.median_tpot_ms:.2f} |", flush=True)


if __name__ == "__main__":
    main()
