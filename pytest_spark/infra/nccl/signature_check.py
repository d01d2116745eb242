"""What a low busbw figure means: read against the two failure signatures the profile names
(``nccl.socket_busbw_gbps``: TCP socket fallback, ~3 GB/s; ``nccl.one_twin_busbw_gbps``: one
fabric twin only, ~13.5 GB/s, REFERENCE §3) and, near the one-twin figure, against the
devices each rank's NCCL chose. :func:`busbw_signature` decides (pure), :func:`low_busbw_why`
says it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pytest_spark.infra.nccl.parse import NetTransport

__all__ = ["ONE_TWIN_BAND", "SOCKET_BAND", "Signature", "busbw_signature", "low_busbw_why"]

SOCKET_BAND = 1.6  # up to 1.6x the socket-fallback figure reads as socket fallback
ONE_TWIN_BAND = (0.7, 1.3)  # within this factor of the one-twin figure reads as one twin

Signature = Literal["socket", "one-twin", "unknown"]


def busbw_signature(busbw: float, profile: Any) -> Signature:
    """Which known signature a figure below the floor matches: about the TCP-socket figure
    (up to :data:`SOCKET_BAND` times it), about the one-twin figure (within
    :data:`ONE_TWIN_BAND`), or none."""
    one_twin = profile.nccl.one_twin_busbw_gbps
    socket = profile.nccl.socket_busbw_gbps
    if socket and busbw <= float(socket) * SOCKET_BAND:
        return "socket"
    if one_twin and ONE_TWIN_BAND[0] <= busbw / float(one_twin) <= ONE_TWIN_BAND[1]:
        return "one-twin"
    return "unknown"


def low_busbw_why(
    busbw: float,
    profile: Any,
    *,
    backend: str | None,
    transports: Sequence[NetTransport],
    fabric_devs: Sequence[str],
) -> str:
    """The likely cause of a low figure, in words, with what to check."""
    one_twin = profile.nccl.one_twin_busbw_gbps
    socket = profile.nccl.socket_busbw_gbps
    signature = busbw_signature(busbw, profile)
    if signature == "socket":
        why = (
            f"About the TCP-socket figure (~{float(socket):g} GB/s): TCP socket fallback "
            "or NCCL built without IB. Check the NCCL INFO lines say NET/IB, not "
            "NET/Socket; NCCL_IB_DISABLE must be 0, NCCL_IB_HCA must name Up devices "
            "(ibdev2netdev), and the container needs libibverbs and /dev/infiniband."
        )
    elif signature == "one-twin":
        why = _one_twin_reading(float(one_twin), transports, fabric_devs)
    else:
        sigs = []
        if one_twin:
            sigs.append(f"one twin only ~{float(one_twin):g}")
        if socket:
            sigs.append(f"TCP fallback ~{float(socket):g}")
        why = (
            "Not a known signature"
            + (f" ({', '.join(sigs)} GB/s)" if sigs else "")
            + ": check link rate (ethtool), MTU >= 4200 on both twins, other traffic on "
            "the fabric, and that the largest size reaches steady state (-e 1G)."
        )
    if backend == "gloo":
        why += (
            " This run measured with gloo, which reduces on the CPU: a busy CPU on any node "
            "lowers the figure too."
        )
    return why


def _twins_in_use(
    transports: Sequence[NetTransport], fabric_devs: Sequence[str]
) -> tuple[list[str], list[str]]:
    """(nodes whose NCCL uses every fabric device, nodes using fewer or NET/Socket)."""
    both: list[str] = []
    fewer: list[str] = []
    for t in transports:
        full = t.kind == "IB" and all(d in t.devices for d in fabric_devs)
        (both if full else fewer).append(t.host)
    return sorted(set(both)), sorted(set(fewer))


def _one_twin_reading(
    one_twin: float, transports: Sequence[NetTransport], fabric_devs: Sequence[str]
) -> str:
    """What a figure near the one-twin one means, given which devices each rank used."""
    figure = f"About the one-twin figure (~{one_twin:g} GB/s)"
    both, fewer = _twins_in_use(transports, fabric_devs)
    devs = ",".join(fabric_devs)
    predicted = (
        " (predicted from the NCCL_* env and HCA state)"
        if any(t.predicted for t in transports)
        else ""
    )
    if fewer:
        return (
            f"{figure}: one twin only on {', '.join(fewer)}{predicted}: check NCCL_IB_HCA "
            f"lists both {devs} and both are Up (ibdev2netdev)."
        )
    if both:
        return (
            f"{figure}, but every rank's NCCL uses both twins ({devs}){predicted}, so not a "
            "missing twin: a link negotiated at 100G (ethtool: Speed 100000Mb/s) gives the "
            "same figure; then check MTU >= 4200 on both twins and other traffic on the fabric."
        )
    return (
        f"{figure}: one twin only: check NCCL_IB_HCA lists both {devs} and both are Up "
        "(ibdev2netdev). A link negotiated at 100G (ethtool: Speed 100000Mb/s) gives the "
        "same figure."
    )
