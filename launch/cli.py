"""`lab up`, `lab down`, `lab ps`, `lab fault`, `lab clean`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from lab.shared.config_cli import MAX_SECONDS, FiniteFloatRange, Settings, options, setting
from lab.shared.ray_connect import ray_address_setting
from lab.shared.sidecar_settings import STARTUP_WAIT_PREFIX
from launch.clean import _kill_group_of, leftovers_of
from launch.cli_options import spec_from_options, topology_options
from launch.errors import LaunchError, RunError, TopologyError
from launch.faults import FAULT_KINDS
from launch.process import START_MARK
from launch.rundir import make_run_dir, resolve_run
from launch.state import observed_states, read_state, same_process, supervisor_alive
from launch.topology import TopologySpec

SPEC_FILE = "spec.json"
SUPERVISOR_LOG = "supervisor.log"


# -- output -----------------------------------------------------------------------------------


def _console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


_LOG_TAIL_BYTES = 64 * 1024


def startup_wait(process: dict[str, Any]) -> str | None:
    """What a sidecar that is not ready yet last said about its wait for the engine ("waiting
    for engine 127.0.0.1:5000: connection refused since 12:01:03, attempt 7"), from the tail of
    its log since the launcher's last start of it; None for anything else."""
    if process.get("role") != "sidecar" or process.get("state") != "starting":
        return None
    try:
        with open(process.get("log") or "", "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - _LOG_TAIL_BYTES))
            tail = log.read().decode(errors="replace")
    except OSError:
        return None
    tail = tail.rpartition(START_MARK)[2]
    lines = [line for line in tail.splitlines() if STARTUP_WAIT_PREFIX in line]
    return lines[-1][lines[-1].index(STARTUP_WAIT_PREFIX):] if lines else None


def print_processes(processes: list[dict[str, Any]], check_alive: bool = False,
                    observed: dict[str, str] | None = None) -> None:
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    notes: list[str] = []  # printed below the table: too long for a column
    hosts = any(p.get("host") for p in processes)
    nodes = any(p.get("node") for p in processes)
    for column in ("role", "name", "pid", *(("host",) if hosts else ()),
                   *(("ray node",) if nodes else ()), "address", "state", "restarts"):
        table.add_column(column)
    for p in processes:
        state = p["state"]
        if p.get("exit_code") is not None and state in ("exited", "backoff", "stopped"):
            state = f"{state} ({p['exit_code']})"
        if check_alive and state in ("ready", "starting") and not same_process(
            p.get("pid"), p.get("create_time")
        ):
            state = f"{state} (gone)"
        elif observed and p["name"] in observed:
            state = observed[p["name"]]
        elif check_alive and (waiting := startup_wait(p)) is not None:
            state = "waiting"  # starting, and saying why below the table
            notes.append(f"{p['name']}: {waiting}")
        role = p["role"] if not p.get("fleet_role") else f"{p['role']}/{p['fleet_role']}"
        host = (p.get("host") or "(root)",) if hosts else ()
        node = (str(p.get("node") or "(here)")[:12],) if nodes else ()
        table.add_row(role, p["name"], str(p.get("pid") or "-"), *host, *node,
                      p.get("address") or "-",
                      state, str(p.get("restarts", 0)))
    _console().print(table)
    for note in notes:
        click.echo(note)


def _print_event(event: dict[str, Any]) -> None:
    if event["event"] in ("exit", "restart", "fault", "not-ready", "kill", "error"):
        parts = [f"{event['event']}", event.get("name") or ""]
        if event.get("code") is not None:
            parts.append(f"code={event['code']}")
        for key in ("kind", "attempt", "delay_s", "reason"):
            if event.get(key) is not None:
                parts.append(f"{key}={event[key]}")
        click.echo("[lab up] " + " ".join(p for p in parts if p), err=True)
    elif event["event"] == "ready" and event.get("name"):
        click.echo(f"[lab up] ready {event['name']} {event.get('address')}", err=True)


def _print_ready(run_dir: Path, url: str, processes: list[dict[str, Any]]) -> None:
    click.echo(f"frontend: {url}")
    click.echo(f"run dir:  {run_dir}")
    print_processes(processes)


# -- lab up -----------------------------------------------------------------------------------


def _install_uvloop() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass


async def _serve(spec: TopologySpec, run_dir: Path, quiet: bool, ray: str | None = None) -> int:
    """Run a stack until SIGINT/SIGTERM. Returns the exit code."""
    from launch.stack import Stack

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    main = asyncio.current_task()
    phase = {"ready": False, "signals": 0}
    stack = Stack(spec, run_dir, ray_address=ray)

    def on_signal() -> None:
        phase["signals"] += 1
        if not phase["ready"]:
            assert main is not None
            main.cancel()
        elif phase["signals"] > 1 and stack.supervisor is not None:
            stack.supervisor.kill_all_now()  # second Ctrl-C: no more grace
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        async with stack:
            phase["ready"] = True
            if not quiet:
                _print_ready(run_dir, stack.frontend_url, [v.to_dict() for v in stack.processes()])
                click.echo("Ctrl-C to stop.", err=True)
            stack.on_event(_print_event)
            await stop.wait()
            click.echo("[lab up] stopping ...", err=True)
    except LaunchError as exc:
        click.echo(f"Error: {exc}", err=True)
        return 1
    except asyncio.CancelledError:
        click.echo("[lab up] interrupted during start-up; stopped.", err=True)
        return 130
    click.echo(f"[lab up] stopped; run dir {run_dir}", err=True)
    return 0


def _detach(spec: TopologySpec, run_dir: Path, ray: str | None = None) -> int:
    """Start the supervisor in its own session, wait for readiness, print, return."""
    (run_dir / SPEC_FILE).write_text(json.dumps(spec.to_dict(), indent=2) + "\n")
    with open(run_dir / SUPERVISOR_LOG, "ab") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "launch", "--supervise", str(run_dir),
             *(("--ray", ray) if ray else ())],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    deadline = time.monotonic() + spec.ready_timeout_s + 30
    try:
        while time.monotonic() < deadline:
            state = read_state(run_dir) or {}
            if state.get("state") == "ready" and state.get("supervisor_pid") == child.pid:
                _print_ready(run_dir, state["frontend_url"], state["processes"])
                click.echo(f"detached (supervisor pid {child.pid}); `lab ps {run_dir}`, "
                           f"`lab down {run_dir}`")
                return 0
            if child.poll() is not None:
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        child.terminate()  # the supervisor tears down what it started
        child.wait()
        click.echo("interrupted; stopped.", err=True)
        return 130
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(spec.grace_s * 2 + 10)
        except subprocess.TimeoutExpired:
            child.kill()
        click.echo(f"Error: the supervisor was not ready within {spec.ready_timeout_s + 30:g} s",
                   err=True)
    child.wait()
    state = read_state(run_dir) or {}
    message = state.get("error") or (run_dir / SUPERVISOR_LOG).read_text()[-3000:]
    click.echo(f"Error: {message}", err=True)
    return 1


class UpSettings(Settings):
    """`lab up`'s own options (the topology's are TopologySettings)."""

    out: Path | None = setting(
        None, "Run directory.", default_text="results/<YYYYmmdd-HHMMSS>-<name>",
        path=click.Path(file_okay=False, path_type=Path))
    detach: bool = setting(False, "Run the supervisor in the background; print, exit 0 once "
                           "ready. Stop it with `lab down RUN`.")
    supervise: Path | None = setting(
        None, "Internal: the detached supervisor of a prepared run directory.", hidden=True,
        path=click.Path(file_okay=False, path_type=Path))
    ray: str | None = ray_address_setting(
        "the processes the topology places on Ray nodes (`ray_resource`, `ray_labels`, "
        "`frontend_ray_resource`, `frontend_ray_labels`), each node's under an agent actor",
        "everything here")


@click.command()
@topology_options
@options(UpSettings, param="run")
def up(run: UpSettings, **kwargs: Any) -> None:
    """Launch a topology (engines, sidecars, frontend), print the frontend URL and the
    processes, and supervise it until Ctrl-C / SIGTERM.

    \b
    Examples:
      lab up                              one aggregated engine
      lab up --engines 2 --speedup 0
      lab up --disagg --prefill 1 --decode 2 --restart-engine on-failure
      lab up --topology exp.toml --detach
      lab up --topology placed.toml --ray auto   fleets on Ray nodes (docs/ray.md)
    """
    _install_uvloop()
    out, detach, supervise = run.out, run.detach, run.supervise
    if supervise is not None:
        spec = TopologySpec.from_dict(json.loads((supervise / SPEC_FILE).read_text()))
        sys.exit(asyncio.run(_serve(spec, supervise, quiet=True, ray=run.ray)))
    spec = spec_from_options(**kwargs)
    try:
        spec.check_ray(run.ray)
    except TopologyError as exc:
        raise click.UsageError(str(exc)) from None
    if run.ray is not None and not spec.ray_placement():
        raise click.UsageError("--ray: the topology places nothing on Ray nodes (give a fleet "
                               "ray_resource or ray_labels; docs/ray.md)")
    try:
        run_dir = make_run_dir(spec.name, out)
    except RunError as exc:
        raise click.BadParameter(str(exc), param_hint="'--out'") from exc
    if detach:
        sys.exit(_detach(spec, run_dir, run.ray))
    sys.exit(asyncio.run(_serve(spec, run_dir, quiet=False, ray=run.ray)))


# -- lab ps / down / fault --------------------------------------------------------------------


def _run_arg(run: str) -> tuple[Path, dict[str, Any]]:
    try:
        run_dir = resolve_run(run)
    except RunError as exc:
        raise click.BadParameter(str(exc), param_hint="'RUN'") from exc
    state = read_state(run_dir)
    if state is None:
        raise click.BadParameter(f"{run_dir} has no state.json (not a run of `lab up`)",
                                 param_hint="'RUN'")
    return run_dir, state


@click.command()
@click.argument("run")
@click.option("--json", "as_json", is_flag=True, help="Print state.json (with liveness) as JSON.")
def ps(run: str, as_json: bool) -> None:
    """Show the processes of a run (RUN = run directory, or a run name under results/).

    STATE is the supervisor's (starting, ready, backoff, exited, stopped) unless the system
    or discovery sees otherwise: `stopped (SIGSTOP)`, `withdrawn` (a live sidecar out of
    discovery: its engine stalled), `stalled` (an engine that answers but serves nothing),
    `waiting` (a sidecar not ready yet; why, below the table, e.g. "waiting for engine
    127.0.0.1:5000: connection refused since 12:01:03, attempt 7").
    """
    run_dir, state = _run_arg(run)
    alive = supervisor_alive(state)
    if as_json:
        observed = observed_states(state)
        for p in state["processes"]:
            p["alive"] = same_process(p.get("pid"), p.get("create_time"))
            p["observed"] = observed.get(p["name"], p["state"])
            p["waiting"] = startup_wait(p)
        click.echo(json.dumps({**state, "supervisor_alive": alive}, indent=2))
        return
    status = state["state"] if alive else f"{state['state']} (supervisor not running)"
    click.echo(f"run:      {run_dir}")
    click.echo(f"state:    {status}  (supervisor pid {state.get('supervisor_pid')})")
    click.echo(f"frontend: {state.get('frontend_url') or '-'}")
    print_processes(state["processes"], check_alive=True, observed=observed_states(state))




@click.command()
@click.argument("run")
@click.option("--timeout", type=FiniteFloatRange(min=0, max=MAX_SECONDS), default=None,
              help="Seconds to wait for the supervisor's teardown.  [default: 2 x grace + 15]")
def down(run: str, timeout: float | None) -> None:
    """Stop a run started with `lab up` (SIGTERM its supervisor; it tears the fleet down)."""
    run_dir, state = _run_arg(run)
    pid = state.get("supervisor_pid")
    if supervisor_alive(state):  # alive: its state names an int pid
        assert isinstance(pid, int)
        os.kill(pid, signal.SIGTERM)
        limit = timeout if timeout is not None else 2 * float(state.get("grace_s", 10)) + 15
        deadline = time.monotonic() + limit
        while supervisor_alive(state) and time.monotonic() < deadline:
            time.sleep(0.1)
        if supervisor_alive(state):
            os.kill(pid, signal.SIGKILL)
            click.echo(f"supervisor (pid {pid}) did not stop within {limit:g} s: killed", err=True)
        else:
            click.echo(f"stopped {run_dir} (supervisor pid {pid})")
    else:
        click.echo(f"supervisor of {run_dir} is not running (state {state.get('state')})")
    time.sleep(0.2)
    for victim in leftovers_of(read_state(run_dir) or state):
        _kill_group_of(victim["pid"])
        click.echo(f"killed leftover {victim['name']} (pid {victim['pid']})")


@click.command()
@click.argument("run")
@click.option("--process", "name", required=True, help="Process name, e.g. engine-decode-0.")
@click.option("--kind", type=click.Choice(list(FAULT_KINDS)), required=True,
              help="; ".join(f"{k}: {v}" for k, v in FAULT_KINDS.items()))
@click.option("--timeout", type=FiniteFloatRange(min=0.1, max=MAX_SECONDS), default=15.0,
              show_default=True,
              help="Seconds to wait for the supervisor's answer.")
def fault(run: str, name: str, kind: str, timeout: float) -> None:
    """Inject a fault into a process of a running `lab up` (the supervisor performs it and
    records a fault event in events.jsonl)."""
    from launch.control import send_request

    run_dir, state = _run_arg(run)
    names = [p["name"] for p in state.get("processes", [])]
    if name not in names:
        raise click.BadParameter(f"{name!r} is not a process of {run_dir} "
                                 f"(processes: {', '.join(names)})", param_hint="'--process'")
    if not supervisor_alive(state):
        raise click.ClickException(f"the supervisor of {run_dir} is not running")
    try:
        reply = send_request(run_dir, {"op": "fault", "name": name, "kind": kind}, timeout,
                             alive=lambda: supervisor_alive(state))
    except TimeoutError as exc:
        raise click.ClickException(str(exc)) from exc
    if not reply.get("ok"):
        raise click.ClickException(f"fault {kind} on {name}: {reply.get('error')}")
    click.echo(reply.get("message") or "ok")


@click.command()
@click.option("--results", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where runs live.  [default: ./results]")
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
def clean(results: Path | None, dry_run: bool) -> None:
    """Kill leftover processes of crashed runs (their supervisor is dead, they are not), and
    remove the network namespaces, links and bridges (`llab*`) of runs whose launcher died."""
    from launch.clean import clean_leftovers, clean_network

    removed = clean_leftovers(results, dry_run=dry_run)
    verb = "would kill" if dry_run else "killed"
    for line in removed:
        click.echo(f"{verb} {line}")
    try:
        network = clean_network(dry_run=dry_run)
    except (RuntimeError, OSError) as exc:
        raise click.ClickException(f"removing leftover network namespaces failed: {exc}") from exc
    for line in network:
        click.echo(line)
    if not removed and not network:
        click.echo("nothing to clean")
