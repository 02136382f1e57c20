"""`--topology` for tests that launch a lab stack only to measure through it (`lab up`,
`lab sweep` without --target): its sidecars skip the serving grace after withdrawing.

That grace (`lab sidecar --grace-period`, 5 s by default) keeps a withdrawn sidecar serving
for frontends that have not seen the withdrawal yet. It ends early once every frontend that had
connected has closed its connections (`Sidecar._grace`), as at a whole-stack teardown; a stack
whose frontend never connected to a sidecar would still wait it out, which this file rules out.
Tests of the grace itself (tests/serve/test_sidecar_process.py) and of faults keep it."""

from __future__ import annotations

from pathlib import Path

NO_GRACE_TOPOLOGY = 'extra_sidecar_args = ["--grace-period", "0"]\n'


def no_grace_topology(dir_: Path, roles: tuple[str, ...] = ()) -> list[str]:
    """`["--topology", FILE]`, FILE written into `dir_` (it must exist); not combinable with the
    shape flags (--engines, --disagg, ...), which a topology file replaces. `roles`: one fleet
    of one engine per role, e.g. ("prefill", "decode"); none = one aggregated engine."""
    path = dir_ / ("-".join(("no-grace-topology", *roles)) + ".toml")
    path.write_text(NO_GRACE_TOPOLOGY + "".join(f'[[fleet]]\nrole = "{r}"\n' for r in roles))
    return ["--topology", str(path)]
