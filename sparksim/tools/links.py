"""Fake ibdev2netdev, ibstat, ibv_devinfo, ibv_devices, rdma and an ethtool wrapper.

Formats follow the real tools byte for byte (ibstat.c, libibverbs devinfo.c, iproute2
rdma/link.c, Mellanox ibdev2netdev): tabs in ibstat and ibv_devinfo, the trailing space
of ``rdma link``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from .ports import Port, State, guid, load_state, operstate, ports, rdma_loaded, rdma_ports

# PCI address of each device's function: domain 0 / domain 2, function 0 / 1.
PCI = {
    "rocep1s0f0": "0000:01:00.0",
    "rocep1s0f1": "0000:01:00.1",
    "roceP2p1s0f0": "0002:01:00.0",
    "roceP2p1s0f1": "0002:01:00.1",
}


def _guid_hex(value: int) -> str:
    return f"0x{value:016x}"


def _guid_colon(value: int) -> str:
    h = f"{value:016x}"
    return ":".join(h[i : i + 4] for i in range(0, 16, 4))


def _err(msg: str, rc: int) -> int:
    sys.stderr.write(msg + "\n")
    return rc


# ---------------------------------------------------------------- ibdev2netdev


def ibdev2netdev(node_dir: str, argv: list[str]) -> int:
    state = load_state(node_dir)
    if not rdma_loaded(state):
        return 255  # Mellanox's script: no /sys/class/infiniband ("driver is stopped"): exit -1
    verbose = "-v" in argv
    out = []
    for p in sorted(ports(state), key=lambda p: p.dev):  # ls order in the C locale
        link = "Up" if operstate(p.netdev) == "up" else "Down"
        if verbose:
            pstate = "ACTIVE" if p.active else "DOWN"
            out.append(
                f"{PCI[p.dev]} {p.dev} ({state['ca_type']} - {psid(state)}) "
                f"fw {state['firmware']} port 1 ({pstate}) ==> {p.netdev} ({link})"
            )
        else:
            out.append(f"{p.dev} port 1 ==> {p.netdev} ({link})")
    sys.stdout.write("".join(line + "\n" for line in out))
    return 0


# ---------------------------------------------------------------------- ibstat


def _port_block(p: Port, state: State, pre: str, hdrpre: str) -> str:
    port_guid = guid(state, p.dev) ^ 0x0200_0000_0000_0000
    return (
        f"{hdrpre}Port 1:\n"
        f"{pre}State: {p.ibstat_state}\n"
        f"{pre}Physical state: {p.phys}\n"
        f"{pre}Rate: {p.rate_text}\n"
        f"{pre}Base lid: 0\n"
        f"{pre}LMC: 0\n"
        f"{pre}SM lid: 0\n"
        f"{pre}Capability mask: 0x00010000\n"
        f"{pre}Port GUID: {_guid_hex(port_guid)}\n"
        f"{pre}Link layer: Ethernet\n"
    )


def _ca_header(p: Port, state: State) -> str:
    g = _guid_hex(guid(state, p.dev))
    return (
        f"CA '{p.dev}'\n"
        f"\tCA type: {state['ca_type']}\n"
        "\tNumber of ports: 1\n"
        f"\tFirmware version: {state['firmware']}\n"
        "\tHardware version: 0\n"
        f"\tNode GUID: {g}\n"
        f"\tSystem image GUID: {g}\n"
    )


def ibstat(node_dir: str, argv: list[str]) -> int:
    state = load_state(node_dir)
    all_ports = rdma_ports(state)
    flags = [a for a in argv if a.startswith("-")]
    args = [a for a in argv if not a.startswith("-")]
    if "-l" in flags or "--list_of_cas" in flags:
        sys.stdout.write("".join(f"{p.dev}\n" for p in all_ports))
        return 0
    if "-p" in flags or "--port_list" in flags:
        sys.stdout.write(
            "".join(_guid_hex(guid(state, p.dev) ^ 0x0200_0000_0000_0000) + "\n" for p in all_ports)
        )
        return 0
    selected = all_ports
    if args:
        selected = [p for p in all_ports if p.dev == args[0]]
        if not selected:
            return _err(f"ibpanic: [{os.getpid()}] main: '{args[0]}' IB device can't be found", 255)
    if len(args) > 1:
        if args[1] != "1":
            return _err(
                f"ibwarn: [{os.getpid()}] ca_stat: CA: '{args[0]}' has no port number "
                f"{args[1]} - max (1)\nibpanic: [{os.getpid()}] main: stat of IB "
                f"device '{args[0]}' failed",
                255,
            )
        p = selected[0]
        sys.stdout.write(f"CA: '{p.dev}'\n" + _port_block(p, state, "", ""))
        return 0
    short = "-s" in flags or "--short" in flags
    text = ""
    for p in selected:
        text += _ca_header(p, state)
        if not short:
            text += _port_block(p, state, "\t\t", "\t")
    sys.stdout.write(text)
    return 0


# ----------------------------------------------------------------- ibv_devinfo


def _devinfo(p: Port, state: State) -> str:
    g = _guid_colon(guid(state, p.dev))
    size, enum = p.active_mtu
    port_state = "PORT_ACTIVE (4)" if p.active else "PORT_DOWN (1)"
    return (
        f"hca_id:\t{p.dev}\n"
        "\ttransport:\t\t\tInfiniBand (0)\n"
        f"\tfw_ver:\t\t\t\t{state['firmware']}\n"
        f"\tnode_guid:\t\t\t{g}\n"
        f"\tsys_image_guid:\t\t\t{g}\n"
        "\tvendor_id:\t\t\t0x02c9\n"
        "\tvendor_part_id:\t\t\t4129\n"
        "\thw_ver:\t\t\t\t0x0\n"
        "\tboard_id:\t\t\tNVD0000000087\n"
        "\tphys_port_cnt:\t\t\t1\n"
        "\t\tport:\t1\n"
        f"\t\t\tstate:\t\t\t{port_state}\n"
        "\t\t\tmax_mtu:\t\t4096 (5)\n"
        f"\t\t\tactive_mtu:\t\t{size} ({enum})\n"
        "\t\t\tsm_lid:\t\t\t0\n"
        "\t\t\tport_lid:\t\t0\n"
        "\t\t\tport_lmc:\t\t0x00\n"
        "\t\t\tlink_layer:\t\tEthernet\n"
        "\n"
    )


NO_VERBS = "Failed to get IB devices list: Function not implemented"


def ibv_devinfo(node_dir: str, argv: list[str]) -> int:
    state = load_state(node_dir)
    if not rdma_loaded(state):  # libibverbs finds no /sys/class/infiniband_verbs: ENOSYS
        return _err(NO_VERBS, 255)
    all_ports = ports(state)
    dev = None
    port = None
    it = iter(argv)
    for a in it:
        if a in ("-d", "--ib-dev"):
            dev = next(it, None)
        elif a.startswith("--ib-dev="):
            dev = a.split("=", 1)[1]
        elif a.startswith("-d") and len(a) > 2:
            dev = a[2:]
        elif a in ("-i", "--ib-port"):
            port = next(it, None)
        elif a.startswith("--ib-port="):
            port = a.split("=", 1)[1]
        elif a in ("-l", "--list"):
            n = len(all_ports)
            sys.stdout.write(
                f"{n} HCA{'s' if n != 1 else ''} found:\n"
                + "".join(f"\t{p.dev}\n" for p in all_ports)
                + "\n"
            )
            return 0
        elif a in ("-v", "--verbose"):
            pass
        else:
            return _err(
                f"Usage: ibv_devinfo             print the ca attributes\n"
                f"ibv_devinfo: invalid option {a}",
                255,
            )
    if not all_ports:
        return _err("No IB devices found", 255)
    selected = all_ports
    if dev is not None:
        selected = [p for p in all_ports if p.dev == dev]
        if not selected:
            return _err(f"IB device '{dev}' wasn't found", 255)
    if port is not None and port != "1":
        sys.stdout.write("".join(_devinfo(p, state).split("\t\tport:")[0] for p in selected))
        return 0
    sys.stdout.write("".join(_devinfo(p, state) for p in selected))
    return 0


def ibv_devices(node_dir: str, argv: list[str]) -> int:
    """libibverbs' ibv_devices: a header, then each device and its node GUID."""
    state = load_state(node_dir)
    if not rdma_loaded(state):
        return _err(NO_VERBS, 1)
    text = f"    {'device':<16}\t   node GUID\n    {'------':<16}\t----------------\n"
    for p in ports(state):
        text += f"    {p.dev:<16}\t{guid(state, p.dev):016x}\n"
    sys.stdout.write(text)
    return 0


# ------------------------------------------------------------------------ rdma


def rdma(node_dir: str, argv: list[str]) -> int:
    state = load_state(node_dir)
    all_ports = rdma_ports(state)
    as_json = False
    pretty = False
    args = []
    for a in argv:
        if a in ("-j", "-json", "--json"):
            as_json = True
        elif a in ("-p", "-pretty", "--pretty"):
            pretty = True
        elif a in ("-d", "-details", "--details"):
            pass
        else:
            args.append(a)
    obj = args[0] if args else "help"
    rest = args[1:]
    if rest and rest[0] in ("show", "list"):
        rest = rest[1:]
    index = {p.dev: i for i, p in enumerate(all_ports)}
    if "link".startswith(obj) and obj:
        sel = all_ports
        if rest:
            name, _, portnum = rest[0].partition("/")
            sel = [p for p in all_ports if p.dev == name and portnum in ("", "1")]
            if not sel:
                return _err("Wrong device name", 1)
        rows = []
        for p in sel:
            state_s = "ACTIVE" if p.active else "DOWN"
            phys = {"LinkUp": "LINK_UP", "Polling": "POLLING"}.get(p.phys, "DISABLED")
            rows.append(
                {
                    "ifindex": index[p.dev],
                    "ifname": p.dev,
                    "port": 1,
                    "state": state_s,
                    "physical_state": phys,
                    "netdev": p.netdev,
                    "netdev_index": p.ifindex,
                }
            )
        if as_json:
            sys.stdout.write(
                json.dumps(
                    rows, indent=4 if pretty else None, separators=None if pretty else (",", ":")
                )
                + "\n"
            )
        else:
            sys.stdout.write(
                "".join(
                    f"link {r['ifname']}/1 state {r['state']} physical_state "
                    f"{r['physical_state']} netdev {r['netdev']} \n"
                    for r in rows
                )
            )
        return 0
    if (obj and "dev".startswith(obj)) or obj == "device":
        sel = [p for p in all_ports if not rest or p.dev == rest[0]]
        if rest and not sel:
            return _err("Wrong device name", 1)
        rows = []
        for p in sel:
            g = _guid_colon(guid(state, p.dev))
            rows.append(
                {
                    "ifindex": index[p.dev],
                    "ifname": p.dev,
                    "node_type": "ca",
                    "fw": state["firmware"],
                    "node_guid": g,
                    "sys_image_guid": g,
                }
            )
        if as_json:
            sys.stdout.write(
                json.dumps(
                    rows, indent=4 if pretty else None, separators=None if pretty else (",", ":")
                )
                + "\n"
            )
        else:
            sys.stdout.write(
                "".join(
                    f"{r['ifindex']}: {r['ifname']}: node_type ca fw {r['fw']} node_guid "
                    f"{r['node_guid']} sys_image_guid {r['sys_image_guid']} \n"
                    for r in rows
                )
            )
        return 0
    if obj == "help":
        sys.stdout.write(
            "Usage: rdma [ OPTIONS ] OBJECT { COMMAND | help }\n"
            "where  OBJECT := { dev | link | resource | system | statistic "
            "| help }\n"
        )
        return 0
    return _err(f'Object "{obj}" is unknown, try "rdma help".', 1)


# --------------------------------------------------------------------- ethtool


def _real_ethtool() -> str:
    for path in ("/usr/sbin/ethtool", "/sbin/ethtool"):
        if os.access(path, os.X_OK):
            return path
    return "ethtool"


def psid(state: State) -> str:
    """The board's PSID (NVIDIA's DGX Spark ConnectX-7: NVD0000000087, ethtool -i on a
    Spark); a fault may change it with the firmware."""
    return str(state.get("psid") or "NVD0000000087")


def _driver_info(state: State, port: Port) -> str:
    """``ethtool -i`` of a ConnectX-7 port as mlx5_core answers it (a Spark's, recorded in
    fixtures/alike/ethtool_i_cx7.txt: driver, the kernel release, firmware with PSID)."""
    return (
        "driver: mlx5_core\n"
        f"version: {os.uname().release}\n"
        f"firmware-version: {state['firmware']} ({psid(state)})\n"
        "expansion-rom-version: \n"
        f"bus-info: {PCI[port.dev]}\n"
        "supports-statistics: yes\n"
        "supports-test: yes\n"
        "supports-eeprom-access: no\n"
        "supports-register-dump: no\n"
        "supports-priv-flags: yes\n"
    )


def _statistics(state: State, netdev: str) -> str | None:
    """``ethtool -S`` of a ConnectX port: state.json ``port_counters`` (steady values),
    plus what a fault makes rise since it began (``counter_rise``: ``{"since": epoch,
    "per_s": {name: rate}}``, faults/link.py's cable-flapping). None: not a ConnectX port."""
    counters = (state.get("port_counters") or {}).get(netdev)
    if counters is None:
        return None
    rise = (state.get("counter_rise") or {}).get(netdev) or {}
    elapsed = max(0.0, time.time() - float(rise.get("since", time.time())))
    values = dict(counters)
    for name, rate in (rise.get("per_s") or {}).items():
        values[name] = int(values.get(name, 0)) + int(elapsed * float(rate))
    return "NIC statistics:\n" + "".join(f"     {k}: {v}\n" for k, v in values.items())


def ethtool(node_dir: str, argv: list[str]) -> int:
    """The real ethtool; for a ConnectX-7 port queried as ``ethtool IF`` the Speed line
    reports the port's rate from state.json (a veth always says 10000Mb/s), and ``ethtool
    -i IF`` answers as mlx5_core (a veth's says ``driver: veth``), and ``ethtool -S IF``
    prints mlx5's counters from state.json (a veth has none of them)."""
    real = _real_ethtool()
    if len(argv) == 2 and argv[0] in ("-i", "--driver"):
        state = load_state(node_dir)
        port = next((p for p in ports(state) if p.netdev == argv[1]), None)
        if port is not None:
            sys.stdout.write(_driver_info(state, port))
            return 0
    if len(argv) == 2 and argv[0] in ("-S", "--statistics"):
        text = _statistics(load_state(node_dir), argv[1])
        if text is not None:
            sys.stdout.write(text)
            return 0
    if len(argv) != 1 or argv[0].startswith("-"):
        os.execv(real, [real, *argv])
    state = load_state(node_dir)
    port = next((p for p in ports(state) if p.netdev == argv[0]), None)
    proc = subprocess.run([real, *argv], capture_output=True, text=True)
    if port is None or proc.returncode != 0:
        sys.stdout.write(proc.stdout)
        sys.stderr.write(proc.stderr)
        return proc.returncode
    lines = []
    for line in proc.stdout.splitlines():
        key = line.strip().split(":", 1)[0]
        if key == "Speed":
            speed = f"{round(port.rate_gbps * 1000)}Mb/s" if port.active else "Unknown!"
            line = f"\tSpeed: {speed}"
        elif key == "Duplex":
            line = "\tDuplex: " + ("Full" if port.active else "Unknown! (255)")
        lines.append(line)
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stderr.write(proc.stderr)
    return proc.returncode
