"""sparksim's fabric faults without a running sim (pure: no root needed): the GID tables
``gid-shift`` writes, read by the suite's own probe, and the link delayer's
nfnetlink_queue messages (sparksim/nfqdelay.py)."""

from __future__ import annotations

import importlib
import struct
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_spark.infra.nccl.gid_check import check_gid_same, check_gid_v2, gid_choices
from pytest_spark.infra.nccl.gid_parse import GID_PROBE, nccl_gid_index, parse_gid_probe

ROOT = "/sys/class/infiniband"


@pytest.fixture(scope="module")
def sim_modules(sparksim: ModuleType) -> tuple[ModuleType, ModuleType, ModuleType]:
    return (
        importlib.import_module("sparksim_under_test.rdmasysfs"),
        importlib.import_module("sparksim_under_test.topology"),
        importlib.import_module("sparksim_under_test.nfqdelay"),
    )


def _read(tree: Path) -> Any:
    script = GID_PROBE.replace(ROOT, str(tree))
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    return parse_gid_probe(out.replace(str(tree), ROOT))


def test_gid_shift_moves_the_ipv4_v2_gid_to_index_5(
    sim_modules: tuple[ModuleType, ModuleType, ModuleType], tmp_path: Path
) -> None:
    rdmasysfs, topology, _ = sim_modules
    head, worker = topology.build(0, 2).nodes
    rdmasysfs.write(tmp_path / "head", head)
    rdmasysfs.write(tmp_path / "worker", worker, "shift")
    ht, wt = _read(tmp_path / "head" / "infiniband"), _read(tmp_path / "worker" / "infiniband")
    devs = [p.dev for p in worker.fabric]
    for dev in devs:
        assert nccl_gid_index(ht[dev]) == (3, False) and nccl_gid_index(wt[dev]) == (5, False)
        assert wt[dev].entry(5).ipv4 == next(p.addr for p in worker.fabric if p.dev == dev)
        assert wt[dev].entry(3).family == "AF_INET6" and wt[dev].entry(3).type == "RoCE v2"
        assert wt[dev].entry(2).address.compressed.startswith("2001:2:")  # RFC 5180 range
    assert check_gid_v2("spark-worker-1", wt, {}, devs).ok  # a RoCE v2 GID all the same
    finding = check_gid_same(
        {"spark-head": gid_choices(ht, {}, devs), "spark-worker-1": gid_choices(wt, {}, devs)},
        "spark-head",
    )
    assert not finding.ok and finding.node == "spark-worker-1"
    assert "GID index 5" in finding.message and "spark-head: 3" in finding.message
    assert "Remove it on spark-worker-1" in finding.message
    # unplugged ports (no fabric address) keep a healthy table; clear writes it back
    rdmasysfs.write(tmp_path / "worker", worker)
    again = _read(tmp_path / "worker" / "infiniband")
    assert all(nccl_gid_index(again[dev]) == (3, False) for dev in devs)
    with pytest.raises(ValueError, match="GID table mode"):
        rdmasysfs.entries(worker, devs[0], "sideways")


def test_delayer_messages_are_nfnetlink_queue_wire_format(
    sim_modules: tuple[ModuleType, ModuleType, ModuleType],
) -> None:
    nfq = sim_modules[2]
    bind, params = nfq.config_messages(17)
    length, kind, flags, seq, _ = struct.unpack_from("=IHHII", bind)
    assert length == len(bind) and len(bind) % 4 == 0
    assert kind == (3 << 8) | 2 and flags == 0x1 | 0x4 and seq == 1  # QUEUE/CONFIG, ACKed
    assert struct.unpack_from("!BBH", bind, 16) == (0, 0, 17)  # AF_UNSPEC, v0, queue 17
    assert struct.unpack_from("=HH", bind, 20) == (8, 1)  # NFQA_CFG_CMD, 4 bytes
    assert bind[24] == 1  # NFQNL_CFG_CMD_BIND
    # copy META (5-byte params, padded), a long queue, flags GSO | FAIL_OPEN with their mask
    assert struct.unpack_from("=HH", params, 20) == (9, 2)
    assert struct.unpack_from("!IB", params, 24) == (0, 1)
    assert struct.unpack_from("=HH", params, 32) == (8, 3)
    assert struct.unpack_from("!I", params, 36) == (65536,)
    assert struct.unpack_from("=HH", params, 40) == (8, 5)
    assert struct.unpack_from("!I", params, 44) == (0x5,)
    assert struct.unpack_from("=HH", params, 48) == (8, 4)  # NFQA_CFG_MASK
    assert struct.unpack_from("!I", params, 52) == (0x5,) and len(params) == 56
    verdict = nfq.verdict_batch(17, 4242)
    assert struct.unpack_from("=IHH", verdict) == (len(verdict), (3 << 8) | 3, 0x1)
    assert struct.unpack_from("!II", verdict, 24) == (1, 4242)  # NF_ACCEPT up to id 4242


def _packet(nfq: ModuleType, packet_id: int) -> bytes:
    hdr = nfq.attr(1, struct.pack("!IHB", packet_id, 0x0800, 0))  # NFQA_PACKET_HDR
    mark = nfq.attr(3, struct.pack("!I", 0))
    return nfq.message(0, 17, mark + hdr)  # NFQNL_MSG_PACKET


def test_delayer_reads_packet_ids_and_errors(
    sim_modules: tuple[ModuleType, ModuleType, ModuleType],
) -> None:
    nfq = sim_modules[2]
    error = struct.pack("=IHHII", 36, 2, 0, 5, 0) + struct.pack("=i", -16) + bytes(16)
    ack = struct.pack("=IHHII", 36, 2, 0, 6, 0) + struct.pack("=i", 0) + bytes(16)
    assert nfq.parse(_packet(nfq, 7) + ack + _packet(nfq, 8) + error) == ([7, 8], [16])


class FakeSock:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        return len(data)


def test_delayer_releases_due_packets_in_one_batch(
    sim_modules: tuple[ModuleType, ModuleType, ModuleType],
) -> None:
    nfq = sim_modules[2]
    sock = FakeSock()
    delayer = nfq.Delayer(sock, 17, 0.005)
    delayer.held.extend([(1.000, 10), (1.001, 11), (1.002, 12), (1.010, 13)])
    delayer.release(0.999)
    assert sock.sent == []  # nothing due yet
    delayer.release(1.0025)
    assert [struct.unpack_from("!II", m, 24)[1] for m in sock.sent] == [12]  # ids 10..12
    assert list(delayer.held) == [(1.010, 13)]
    delayer.release()  # stopping: everything goes
    assert struct.unpack_from("!II", sock.sent[-1], 24)[1] == 13 and not delayer.held
