"""Nodes-alike parsers and checks on recorded probe outputs (fixtures/alike/README.md says
what is real): each failure names the odd node, both values and the fix."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pytest_spark.infra.alike.check import (
    Odd,
    check_host_alike,
    check_image_alike,
    check_time_sync,
    odd_nodes,
)
from pytest_spark.infra.alike.parse import (
    dgx_os_version,
    known,
    os_release_name,
    parse_chronyc_tracking,
    parse_container_facts,
    parse_ethtool_firmware,
    parse_image_inspect,
    parse_smi_versions,
    parse_timedatectl_show,
)
from pytest_spark.infra.alike.probe import (
    CONTAINER_SCRIPT,
    Fact,
    NodeAlike,
    alike_probe_command,
    parse_alike_probe,
)
from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.finding import Finding, Skip

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "alike"
H, W = "spark-head", "spark-worker-1"


def probe(name: str) -> NodeAlike:
    return parse_alike_probe((FIXTURES / name).read_text())


@pytest.fixture(scope="module")
def healthy() -> dict[str, NodeAlike]:
    return {H: probe("probe_head_healthy.txt"), W: probe("probe_worker_healthy.txt")}


@pytest.fixture(scope="module")
def faulty() -> NodeAlike:
    return probe("probe_worker_driver_ntp_nccl_build.txt")


# ---------------------------------------------------------------------------- parsers


def test_probe_parses_every_fact(healthy: dict[str, NodeAlike]) -> None:
    head = healthy[H]
    assert head.hostname == "spark-1"
    assert head.driver == Fact("580.95.05") and head.cuda == Fact("13.0")
    assert head.kernel.value and head.os.value == "Debian GNU/Linux 12 (bookworm)"
    assert head.time_sync is not None and head.time_sync.synchronized is True
    assert head.image is not None and head.image.ref == "vllm-node:latest"
    c = head.container
    assert c is not None and (c.vllm, c.python) == ("0.32.0", "3.11.2")
    assert c.nccl_loaded is not None and c.nccl_loaded.version == "2.27.7+cuda13.0"
    assert c.nccl_package == "2.27.7"


def test_separate_imports_differ_in_id_not_identity(healthy: dict[str, NodeAlike]) -> None:
    a, b = healthy[H].image, healthy[W].image
    assert a is not None and b is not None
    assert a.id != b.id  # the import time is in the config
    assert a.identity == b.identity


def test_os_release_of_dgx_os() -> None:
    text = (FIXTURES / "os_release_dgx_os.txt").read_text()
    assert os_release_name(text) == "Ubuntu 24.04.4 LTS"
    assert os_release_name('NAME=Foo\nVERSION_ID="1"\n') == "Foo 1"
    assert os_release_name("# nothing\n") is None


def test_smi_versions_tolerate_na() -> None:
    header = "| NVIDIA-SMI 580.142   Driver Version: 580.142   CUDA Version: 13.0     |"
    assert parse_smi_versions(header) == ("580.142", "13.0")
    assert parse_smi_versions("| NVIDIA-SMI N/A  Driver Version: N/A  CUDA Version: N/A |") == (
        None,
        None,
    )
    q = "    Driver Version                        : 580.142\n    CUDA Version      : 13.0\n"
    assert parse_smi_versions(q) == ("580.142", "13.0")
    assert parse_smi_versions("No devices were found") == (None, None)
    assert known("[N/A]") is None and known(" Not Supported ") is None


def test_timedatectl_and_chrony() -> None:
    s = parse_timedatectl_show("NTP=no\nNTPSynchronized=no\n")
    assert (s.synchronized, s.ntp_enabled) == (False, False)
    with pytest.raises(ParseError):
        parse_timedatectl_show("Timezone=UTC\n")
    ok = parse_chronyc_tracking((FIXTURES / "chronyc_tracking_synced.txt").read_text())
    bad = parse_chronyc_tracking((FIXTURES / "chronyc_tracking_unsynced.txt").read_text())
    assert (ok.synchronized, bad.synchronized) == (True, False)
    assert "Not synchronised" in bad.detail


def test_chrony_read_when_timedatectl_is_missing(healthy: dict[str, NodeAlike]) -> None:
    text = (FIXTURES / "probe_head_healthy.txt").read_text()
    tracking = (FIXTURES / "chronyc_tracking_unsynced.txt").read_text()
    text = text.replace("NTPSynchronized=yes\n", "").replace(
        "@@pytest-spark-alike@@ begin chrony\n",
        "@@pytest-spark-alike@@ begin chrony\n" + tracking,
    )
    text = text.replace("chronyc: command not found\n", "").replace(
        "end chrony rc=127", "end chrony rc=0"
    )
    sync = parse_alike_probe(text).time_sync
    assert sync is not None and sync.source == "chronyc" and sync.synchronized is False


def test_image_and_container_parsers_refuse_garbage() -> None:
    with pytest.raises(ParseError):
        parse_image_inspect("[]", "x")
    with pytest.raises(ParseError):
        parse_image_inspect("Error: No such image: x", "x")
    with pytest.raises(ParseError):
        parse_container_facts("python3: not found")
    digests = parse_image_inspect(
        '[{"Id": "sha256:1", "RepoDigests": ["r/v@sha256:abc"], "RootFS": {"Layers": ["l"]}}]', "r"
    )
    assert digests.identity == "digests sha256:abc"


def test_probe_command_is_one_shell_command() -> None:
    cmd = alike_probe_command(container="vllm_node", image="vllm-node:latest")
    assert cmd.startswith("sh -c ")
    assert 'docker run --rm --name "pytest-spark-probe-$$" --network none' in cmd
    assert '--entrypoint python3 "$img"' in cmd
    compile(CONTAINER_SCRIPT, "container-script", "exec")  # the image's python3 runs it


# ----------------------------------------------------------------------------- checks


def test_odd_node_is_the_head_when_the_workers_agree() -> None:
    assert odd_nodes(H, {H: "1", W: "1"}) is None
    assert odd_nodes(H, {H: "1", W: "2"}) == Odd((W,), "1", H)
    three = {H: "2", W: "1", "spark-worker-2": "1"}
    assert odd_nodes(H, three) == Odd((H,), "1", "the other 2 nodes")


def test_healthy_nodes_pass(healthy: dict[str, NodeAlike]) -> None:
    assert check_host_alike(H, healthy).ok
    image = check_image_alike(H, healthy, "vllm_node")
    assert not isinstance(image, Skip) and image.ok, image
    sync = check_time_sync(healthy)
    assert not isinstance(sync, Skip) and sync.ok


def test_driver_differs_names_the_worker(healthy: dict[str, NodeAlike], faulty: NodeAlike) -> None:
    f = check_host_alike(H, {**healthy, W: faulty})
    assert not f.ok and f.node == W
    assert "NVIDIA driver: spark-worker-1 has 580.82.09, spark-head has 580.95.05" in f.message
    assert "reboot" in f.message and "kernel release" not in f.message.split("Fix:")[0]


def test_kernel_differs_on_the_head(healthy: dict[str, NodeAlike]) -> None:
    w2 = "spark-worker-2"
    nodes = {H: replace(healthy[H], kernel=Fact("6.17.0-1014-nvidia")), W: healthy[W]}
    nodes[w2] = healthy[W]
    f = check_host_alike(H, nodes)
    assert not f.ok and f.node == H
    assert "spark-head has 6.17.0-1014-nvidia, the other 2 nodes have" in f.message
    assert "uname -r" in f.message


def test_na_driver_is_left_out_not_failed(healthy: dict[str, NodeAlike]) -> None:
    lost = replace(
        healthy[W],
        driver=Fact(None, "nvidia-smi: No devices were found"),
        cuda=Fact(None, "nvidia-smi: No devices were found"),
    )
    f = check_host_alike(H, {H: healthy[H], W: lost})
    assert f.ok
    assert "NVIDIA driver not read on spark-worker-1 (nvidia-smi: No devices were found)" in (
        f.message
    )


def test_nccl_same_version_other_build(healthy: dict[str, NodeAlike], faulty: NodeAlike) -> None:
    f = check_image_alike(H, {**healthy, W: faulty}, "vllm_node")
    assert not isinstance(f, Skip) and not f.ok and f.node == W
    assert "the same version 2.27.7+cuda13.0, a different build" in f.message
    assert "hang" in f.message
    assert "docker save vllm-node:latest | ssh spark-worker-1 docker load" in f.message


def test_vllm_version_differs(healthy: dict[str, NodeAlike]) -> None:
    img = healthy[W].image
    c = healthy[W].container
    assert img is not None and c is not None
    other = replace(
        healthy[W],
        image=replace(img, layers=(*img.layers, "sha256:upgrade")),
        container=replace(c, vllm="0.31.1"),
    )
    f = check_image_alike(H, {H: healthy[H], W: other}, "vllm_node")
    assert not isinstance(f, Skip) and not f.ok
    assert "vLLM 0.31.1 vs 0.32.0" in f.message and "NCCL" not in f.message.split(";")[0]


def test_image_missing_skips_citing_docker_check(healthy: dict[str, NodeAlike]) -> None:
    gone = replace(
        healthy[W], image=None, image_error="Error: No such image: vllm-node:latest", container=None
    )
    s = check_image_alike(H, {H: healthy[H], W: gone}, "vllm_node")
    assert isinstance(s, Skip) and "test_docker_ready" in s.reason
    none = {n: replace(f, image_ref=None, image=None) for n, f in healthy.items()}
    assert isinstance(check_image_alike(H, none, "vllm_node"), Skip)


def test_ntp_unsynchronised(healthy: dict[str, NodeAlike], faulty: NodeAlike) -> None:
    f = check_time_sync({**healthy, W: faulty})
    assert not isinstance(f, Skip) and not f.ok and f.node == W
    assert "NTPSynchronized=no" in f.message and "timedatectl set-ntp true" in f.message
    unknown = {n: replace(x, time_sync=None, time_sync_error="no tool") for n, x in healthy.items()}
    assert isinstance(check_time_sync(unknown), Skip)


# -------------------------------------------- DGX OS, ConnectX-7 firmware, running image


def test_dgx_release_and_ethtool_firmware() -> None:
    assert dgx_os_version((FIXTURES / "dgx_release_station.txt").read_text()) == "7.5.0"
    assert dgx_os_version("DGX_NAME=x\n") is None
    real = (FIXTURES / "ethtool_i_cx7.txt").read_text()
    text = "== enP2p1s0f0np0\n" + real + "== enp1s0f1np1\n" + real
    assert parse_ethtool_firmware(text) == {
        "enP2p1s0f0np0": "28.45.4028 (NVD0000000087)",
        "enp1s0f1np1": "28.45.4028 (NVD0000000087)",
    }
    assert parse_ethtool_firmware(real) == {}  # no "== IFACE" line: no port named


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("dgx_os", "7.2.3", "DGX OS release: spark-worker-1 has 7.2.3, spark-head has 7.5.0"),
        (
            "cx7_firmware",
            "28.39.1002 (NVD0000000087)",
            "ConnectX-7 firmware: spark-worker-1 has 28.39.1002 (NVD0000000087)",
        ),
    ],
)
def test_dgx_os_and_cx7_firmware_parity(
    healthy: dict[str, NodeAlike], field: str, value: str, words: str
) -> None:
    base = {"dgx_os": Fact("7.5.0"), "cx7_firmware": Fact("28.45.4028 (NVD0000000087)")}
    nodes = {n: replace(f, **base) for n, f in healthy.items()}
    assert check_host_alike(H, nodes).ok
    nodes[W] = replace(nodes[W], **{field: Fact(value)})
    f = check_host_alike(H, nodes)
    assert not f.ok and f.node == W and words in f.message
    assert "Fix: " in f.message and ("mlxfwmanager" in f.message or "DGX OS" in f.message)


def test_running_containers_on_another_image_under_the_same_tag(
    healthy: dict[str, NodeAlike],
) -> None:
    img = healthy[H].image
    assert img is not None
    old = replace(img, id="sha256:" + "e" * 64, layers=(*img.layers, "sha256:old"))
    nodes = {n: replace(f, running=f.image) for n, f in healthy.items()}
    assert check_image_alike(H, nodes, "vllm_node").ok  # separate loads: other IDs, alike
    nodes[W] = replace(nodes[W], running=old)
    f = check_image_alike(H, nodes, "vllm_node")
    assert isinstance(f, Finding) and not f.ok and f.node == W
    assert "spark-worker-1's container 'vllm_node' runs image eeeeeeeeeeee" in f.message
    assert "both tagged vllm-node:latest" in f.message
    assert "checks image IDs only when it launches" in f.message


def test_probe_reads_running_image_and_new_sections(healthy: dict[str, NodeAlike]) -> None:
    text = (FIXTURES / "probe_head_healthy.txt").read_text()
    inspect = text.split("@@pytest-spark-alike@@ begin image:vllm-node:latest\n", 1)[1]
    inspect = inspect.split("@@pytest-spark-alike@@ stderr", 1)[0]
    real = (FIXTURES / "ethtool_i_cx7.txt").read_text()
    extra = "".join(
        f"@@pytest-spark-alike@@ begin {name}\n{out}\n@@pytest-spark-alike@@ stderr {name}\n\n"
        f"@@pytest-spark-alike@@ end {name} rc=0\n"
        for name, out in (
            ("dgx_release", 'DGX_SWBUILD_VERSION="7.5.0"'),
            ("cx7_fw", "== enp1s0f1np1\n" + real),
            ("running", "sha256:" + "e" * 64),
            ("running-image", inspect),
        )
    )
    facts = parse_alike_probe(text + extra)
    assert facts.dgx_os == Fact("7.5.0")
    assert facts.cx7_firmware == Fact("28.45.4028 (NVD0000000087)")
    assert facts.running is not None and facts.running.identity == healthy[H].image.identity
    assert healthy[H].running is None and healthy[H].dgx_os.value is None
