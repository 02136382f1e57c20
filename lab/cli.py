"""The `lab` command.

Subcommands are imported lazily, so that a sidecar or frontend process started as
`lab sidecar ...` never imports pandas or matplotlib (a fleet multiplies start-up cost).
"""

from __future__ import annotations

import importlib

import click

# name -> "module:attribute" of a click.Command. One line per subcommand.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "up": ("launch.cli:up", "Launch a topology (engines, sidecars, frontend) and supervise it."),
    "down": ("launch.cli:down", "Stop a detached run started with `lab up --detach`."),
    "ps": ("launch.cli:ps", "Show the processes of a detached run."),
    "fault": ("launch.cli:fault", "Inject a fault into a process of a detached run."),
    "clean": ("launch.cli:clean", "Remove leftovers (processes, namespaces) of crashed runs."),
    "sweep": ("lab.commands.sweep:sweep", "Sweep concurrency on a launched stack or a --target."),
    "report": ("lab.commands.report:report", "Rebuild levels, plots and report.md of a run."),
    "trace": ("lab.commands.trace:trace", "Write a synthetic trace for `lab sweep --trace`."),
    "merge": ("lab.commands.merge:merge", "Join the shards of `lab sweep --shard` into one run."),
    "compare": ("lab.commands.compare:compare", "Compare runs aligned by concurrency."),
    "calibrate": ("lab.commands.calibrate:calibrate",
                  "Measure a --target and fit the mocker's timing to it."),
    "fidelity": ("lab.commands.fidelity:fidelity",
                 "Sweep a --target and the lab's stack side by side."),
    "nagle": ("lab.nagle.command:nagle", "Probe the idle-connection Nagle / delayed-ACK stall."),
    "bench-discovery": ("lab.commands.discovery_bench:bench_discovery",
                        "Measure etcd discovery's CPU per worker event (docs/scale.md)."),
    "render": ("launch.k8s.cli:render", "Render a topology as Kubernetes manifests (render k8s)."),
    "sidecar": ("lab.serve.sidecar.cli:sidecar", "Run one sidecar (engine <-> request plane)."),
    "frontend": ("lab.serve.frontend.cli:frontend", "Run the OpenAI-compatible frontend."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = SUBCOMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, _, attr = entry[0].partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                return _unavailable(cmd_name)
            raise
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SUBCOMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _unavailable(name: str) -> click.Command:
    @click.command(name=name)
    def not_built() -> None:
        raise click.ClickException(f"`lab {name}` is not available in this build")

    return not_built


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="loadlab")
def main() -> None:
    """The load lab: launch an LLM serving path with CPU mock engines, and measure it.

    Typical use: `lab sweep --conc 1,32,128,256 --disagg`.
    """


if __name__ == "__main__":
    main()
