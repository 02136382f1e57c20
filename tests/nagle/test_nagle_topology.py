"""`lab nagle --topology FILE`: each arm launches the file's topology with its own sockets."""

from __future__ import annotations

from pathlib import Path

from tests.in_process import lab as _lab


def test_nagle_launches_each_arm_on_the_topology_file(tmp_path: Path) -> None:
    topo = tmp_path / "two.toml"
    topo.write_text('name = "two"\nspeedup = 1000.0\n[[fleet]]\nrole = "aggregated"\ncount = 2\n')
    out = tmp_path / "run"
    res = _lab("nagle", "--topology", str(topo), "--arms", "control", "--requests", "30",
               "--many", "2", "--osl", "4", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    logs = out / "arms" / "control" / "logs"
    # two engines, as the file says (the built-in arm topology has one)
    assert (logs / "engine-0.log").exists() and (logs / "engine-1.log").exists()
    assert "control" in res.stdout


def test_nagle_rejects_a_bad_topology_file(tmp_path: Path) -> None:
    topo = tmp_path / "bad.toml"
    topo.write_text('[[fleet]]\nrole = "aggregated"\ncuont = 2\n')
    res = _lab("nagle", "--topology", str(topo), "--out", str(tmp_path / "run"))
    assert res.returncode == 2
    assert "cuont" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "run").exists()
