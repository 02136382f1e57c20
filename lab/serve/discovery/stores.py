"""The store a `--discovery` spec names: `file:DIR` or `etcd://HOST:PORT[/prefix]`."""

from __future__ import annotations

from typing import Any

from lab.serve.discovery.base import Registry
from lab.serve.discovery.file_store import FileRegistry


def open_registry(spec: str, **options: Any) -> Registry:
    """`file:DIR` (the default store) or `etcd://HOST:PORT[/prefix]`. Raises ValueError naming
    the spec when it is not understood."""
    scheme, sep, rest = spec.partition(":")
    if scheme == "file" and sep and rest:
        return FileRegistry(rest, **options)
    if scheme == "etcd" and sep:
        # imported here, not above: the etcd store needs aiohttp, which a sidecar on the file
        # store (the default) never loads (start-up cost times the fleet)
        from lab.serve.discovery.etcd_store import EtcdRegistry

        return EtcdRegistry.from_spec(spec, **options)
    raise ValueError(f"--discovery {spec!r}: expected file:DIR or etcd://HOST:PORT[/prefix]")
