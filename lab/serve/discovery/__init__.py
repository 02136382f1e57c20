"""Worker discovery: a small registry interface and its implementations.

`open_registry("file:DIR")` returns the embedded default. Callers only use `Registry`, so a
networked store (etcd) can be added without touching them.
"""

from __future__ import annotations

from lab.serve.discovery.base import Changes, Registry, WorkerRecord
from lab.serve.discovery.stores import open_registry

__all__ = ["Changes", "Registry", "WorkerRecord", "open_registry"]
