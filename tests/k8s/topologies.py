"""The topologies the Kubernetes tests render: aggregated, and 2 prefill + 4 decode."""

from __future__ import annotations

from launch.topology import TopologySpec


def aggregated(engines: int = 2) -> TopologySpec:
    return TopologySpec.aggregated(engines=engines, name="agg")


def disaggregated(prefill: int = 2, decode: int = 4) -> TopologySpec:
    return TopologySpec.disaggregated(prefill=prefill, decode=decode, name="pd")
