"""The launcher: fleets of engines (each with its sidecar) and a frontend, supervised.

Library (what `lab up`, `lab sweep` and `lab nagle` share):

    from launch.topology import TopologySpec, FleetSpec     # what to launch
    from launch.stack import Stack                          # async context manager
    from launch.cli_options import topology_options, spec_from_options   # the shared flags
    from launch.config import write_config                  # config.json (merge extra sections)
    from launch.rundir import make_run_dir, resolve_run     # results/<timestamp>-<name>
    from launch.errors import LaunchError, TopologyError, RunError

    async with Stack(TopologySpec.disaggregated(prefill=1, decode=1), run_dir) as stack:
        stack.frontend_url, stack.model, stack.processes(), stack.cpu_samples()
        await stack.fault("engine-decode-0", "kill")

A run directory holds config.json, state.json, events.jsonl, procs.parquet, logs/<name>.log,
discovery/ (the file registry) and control/ (requests from `lab fault`).
"""
