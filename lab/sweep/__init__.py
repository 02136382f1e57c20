"""`lab sweep`'s command line and what other commands take from it: its settings model, its
`--shard` mode (one of N client pods), the run directory and client options of `lab calibrate`
/ `lab fidelity`, and the --target and workload options it shares with `lab nagle`."""
