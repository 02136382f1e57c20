"""One thing the Nagle probe found, as data: what `lab.nagle.verdict` decides and
`lab.nagle.words` puts into sentences."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lab.nagle.stats import StallStats


@dataclass(frozen=True)
class Finding:
    """One thing the probe found: `kind` names it, `values` hold the numbers behind it.

    Stats values are StallStats; shares are fractions (0.95), times milliseconds.
    """

    kind: str
    values: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "values": {
                k: (v.to_dict() if isinstance(v, StallStats) else v) for k, v in self.values.items()
            },
        }
