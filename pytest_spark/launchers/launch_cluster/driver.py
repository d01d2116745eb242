"""launch-cluster.sh driven on the head over SSH: the script's checks (there, knows
``--ray``), its ``.env`` read, the backgrounded start and its log; and what its command line
is built from (the nodes' fabric addresses for ``-n``, the Ray mode an old script allows)."""

from __future__ import annotations

import shlex
import uuid
from dataclasses import replace

from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.launchers.base import LaunchError, NotServing
from pytest_spark.launchers.launch_cluster.commands import RAY_FLAG_PATTERN, LaunchSpec, shell_path
from pytest_spark.launchers.launch_cluster.dotenv import dotenv_path, parse_dotenv
from pytest_spark.settings.resolve import Settings

DEFAULT_CONTAINER = "vllm_node"  # launch-cluster.sh's default --name


class Launcher:
    """Starts and stops the serving cluster through the head; remembers what it started."""

    def __init__(self, head: Node, spec: LaunchSpec) -> None:
        self.head = head
        self.spec = spec
        self.pid: int | None = None
        self.knows_ray = True  # the script has a --ray flag (read by preflight)

    def preflight(self) -> None:
        """The script is there; and whether it knows ``--ray`` (:attr:`knows_ray`)."""
        script = shell_path(self.spec.script)
        result = self.head.run(
            f"test -f {script} || exit 3; grep -qE -- {shlex.quote(RAY_FLAG_PATTERN)} {script} "
            "&& echo ray-flag; true",
            timeout=15,
        )
        if not result.ok:
            raise LaunchError(
                f"{self.head.name}: launch script {self.spec.script} not found on the head; "
                "clone eugr/spark-vllm-docker there (git clone ... ~/spark-vllm-docker) or "
                "set --spark-launch-script to its path"
            )
        self.knows_ray = "ray-flag" in result.stdout

    def without_ray_flag(self) -> None:
        """An older launch-cluster.sh (before mid-2026) always starts Ray and has no
        ``--ray``: passing one would make it the command to run."""
        self.spec = replace(self.spec, ray=False)

    def dotenv(self) -> dict[str, str]:
        """The launcher's ``.env`` beside the script (empty when there is none)."""
        path = shell_path(dotenv_path(self.spec.script))
        result = self.head.run(f"cat {path} 2>/dev/null; true", timeout=15)
        return parse_dotenv(result.stdout)

    def start(self) -> int:
        result = self.head.run(self.spec.start_command(), timeout=30)
        pid = result.stdout.strip().splitlines()[-1:] if result.ok else []
        if not pid or not pid[0].isdigit():
            raise LaunchError(
                f"{self.head.name}: could not start the launcher:\n{result.evidence()}"
            )
        self.pid = int(pid[0])
        return self.pid

    def launcher_log(self, lines: int = 40) -> str:
        try:
            result = self.head.run(
                f"tail -n {int(lines)} {shlex.quote(self.spec.log_path)}", timeout=10
            )
        except RemoteError:
            return ""
        return result.stdout


def fabric_addresses(cluster: Cluster) -> tuple[str, ...]:
    """Each node's address on its primary fabric interface, as launch-cluster.sh wants them
    in -n (it checks that the local fabric IP is in that list)."""
    from pytest_spark.infra.links.gather import node_link_facts
    from pytest_spark.infra.links.probe import primary_fabric_if

    addresses = []
    for node in cluster.nodes:
        facts = node_link_facts(cluster, node)
        ifname = primary_fabric_if(facts)
        addrs = facts.ip_addrs.get(ifname or "", [])
        if not addrs:
            why = (
                ""
                if facts.roce or facts.rdma
                else " (ibdev2netdev and `rdma link` list no RDMA device: are the RDMA "
                "drivers loaded? modprobe mlx5_ib)"
            )
            raise NotServing(
                f"{node.name}: no fabric interface with an IPv4 address (ibdev2netdev Up)"
                f"{why}: cannot give launch-cluster.sh its -n list; set --spark-launch-nodes"
            )
        addresses.append(str(addrs[0].ip))
    return tuple(addresses)


def launch_spec(settings: Settings, cluster: Cluster, ray: bool = False) -> LaunchSpec:
    if not settings.serve_args:
        raise NotServing(
            "--spark-launch needs --spark-serve-args='vllm serve MODEL ...' (the "
            "command the launcher runs in the head container)"
        )
    nodes = settings.launch_nodes or fabric_addresses(cluster)
    return LaunchSpec(
        settings.launch_script,
        tuple(nodes),
        settings.image,
        settings.container,
        tuple(shlex.split(settings.serve_args)),
        settings.nccl_debug,
        log_path=f"/tmp/pytest-spark-launch-{uuid.uuid4().hex[:12]}.log",
        ray=ray,
    )


def ray_only_script(
    launcher: Launcher, settings: Settings, mode: str | None, mode_source: str
) -> tuple[str | None, str]:
    """A launch-cluster.sh without ``--ray`` (before mid-2026) always starts Ray: pass no
    flag, and watch a Ray cluster; asked for no Ray explicitly, say it cannot."""
    if launcher.knows_ray:
        return mode, mode_source
    if mode == "no-ray" and settings.ray == "off":
        raise LaunchError(
            f"{launcher.head.name}: {launcher.spec.script} has no --ray option: it predates "
            "launch-cluster.sh's no-Ray mode and always starts Ray, but "
            f"{settings.source('ray')} asks for no Ray (--spark-ray=off); update the "
            "script's checkout (git pull) or give --spark-ray=on"
        )
    launcher.without_ray_flag()
    return "ray", f"{launcher.spec.script} has no --ray option (it always starts Ray)"


def apply_dotenv(cluster: Cluster, settings: Settings, launcher: Launcher) -> Launcher:
    """The launcher's ``.env`` wins over some of its flags. Its CONTAINER_NAME wins over
    ``--name vllm_node`` (the script's default name, even when given): the watch then uses
    it, or fails when --spark-container was set to vllm_node on purpose. LOCAL_IP (the
    head's address, always wins) and ETH_IF (used as no --eth-if is given) are checked."""
    env = launcher.dotenv()
    where = f"{cluster.head.name}: {launcher.spec.script}'s .env"
    name = env.get("CONTAINER_NAME")
    spec = launcher.spec
    if name and name != spec.container and spec.container == DEFAULT_CONTAINER:
        if settings.source("container") != "default":
            raise NotServing(
                f"{where} sets CONTAINER_NAME={name}, but --spark-container is "
                f"{spec.container!r} ({settings.source('container')}): the launcher names "
                f"its containers after the .env when --name is {DEFAULT_CONTAINER}. Give the "
                "same name to both, or remove it from the .env"
            )
        spec = replace(spec, container=name)
    local_ip = env.get("LOCAL_IP")
    if local_ip and local_ip not in spec.nodes:
        raise NotServing(
            f"{where} sets LOCAL_IP={local_ip}, not among the launcher's nodes "
            f"{','.join(spec.nodes)}: the head would not find itself in -n. Fix LOCAL_IP, or "
            "set --spark-launch-nodes"
        )
    eth_if = env.get("ETH_IF")
    if eth_if:
        check = cluster.head.run(f"ip -o link show dev {shlex.quote(eth_if)}", timeout=15)
        if not check.ok:
            raise NotServing(
                f"{where} sets ETH_IF={eth_if}, which {cluster.head.name} does not have: "
                f"{(check.stderr or check.stdout).strip()[:200]}. Fix ETH_IF (ibdev2netdev "
                "lists the fabric interfaces)"
            )
    return launcher if spec is launcher.spec else Launcher(launcher.head, spec)
