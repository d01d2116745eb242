"""Parsers of a ConnectX port's counters: ``ethtool -S IF`` (mlx5's ``     name: value``
lines) and ``/sys/class/infiniband/DEV/ports/1/hw_counters/*`` (one decimal number a
file). Pure functions over text. Recorded real outputs: ``fixtures/counters/``.
"""

from __future__ import annotations

import re

from pytest_spark.infra.errors import ParseError

__all__ = ["ETH_ERRORS", "ROCE_ERRORS", "parse_ethtool_stats", "rises"]

# mlx5's error counters of ``ethtool -S`` (names as exported: mlx5e_grp_phy_fill_strings in
# the kernel's en_stats.c; the list of a ConnectX health tool, code index id 70337764037),
# plus the link's own: link_down_events_phy (not "link_down_events": mlx5's name) and the
# PCS symbol errors. Left out, they rise on a healthy link: rx_corrected_bits_phy (FEC
# corrected them), outbound_pci_stalled_* and the packet / byte counts.
ETH_ERRORS = (
    "link_down_events_phy",
    "rx_crc_errors_phy",
    "rx_symbol_err_phy",
    "rx_pcs_symbol_err_phy",
    "rx_in_range_len_errors_phy",
    "rx_out_of_range_len_phy",
    "rx_oversize_pkts_phy",
    "rx_unsupported_op_phy",
    "rx_discards_phy",
    "tx_discards_phy",
    "tx_errors_phy",
    "rx_undersize_pkts_phy",
    "rx_fragments_phy",
    "rx_jabbers_phy",
)
# mlx5's RoCE hw_counters that count errors (drivers/infiniband/hw/mlx5/counters.c). Left
# out: *_cqe_flush_error (a queue pair's teardown flushes its posted work requests), the
# congestion ones (np_cnp_sent, rp_cnp_handled, np_ecn_marked_roce_packets: ECN at work)
# and the request counts.
ROCE_ERRORS = (
    "out_of_sequence",
    "out_of_buffer",
    "duplicate_request",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "rnr_nak_retry_err",
    "req_transport_retries_exceeded",
    "req_rnr_retries_exceeded",
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
)

_STAT = re.compile(r"^\s+([A-Za-z0-9_.\[\]-]+):\s+(\d+)\s*$")


def parse_ethtool_stats(text: str) -> dict[str, int]:
    """``ethtool -S IF`` -> counter -> value. The ``NIC statistics:`` header and blank
    lines are skipped; any other line that is not ``     name: value`` is an error."""
    out: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.strip() == "NIC statistics:":
            continue
        m = _STAT.match(line)
        if m is None:
            raise ParseError("ethtool -S", "expected `     name: value`", line, lineno)
        out[m[1]] = int(m[2])
    return out


def rises(
    before: dict[str, int], after: dict[str, int], watched: tuple[str, ...]
) -> list[tuple[str, int, int]]:
    """(counter, before, after) of each watched counter that rose; a counter missing from
    either reading is not compared (a driver that does not export it)."""
    return [
        (name, before[name], after[name])
        for name in watched
        if name in before and name in after and after[name] > before[name]
    ]
