"""Benchmarks and the fakes they run against: not shipped in the wheel, run from a checkout as
`python -m tests.bench.<name>` (docs/running.md "Development")."""
