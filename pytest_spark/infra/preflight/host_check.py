"""Preflight, the host: the GPU visible, clocks in step, passwordless SSH from the head,
the fabric links not flapping, the node reachable at all.

Pure functions over :mod:`pytest_spark.infra.preflight.probe` facts and profile thresholds
(``preflight.*``): a :class:`Finding` whose failure message names the node, what was
measured, what was expected and the usual fix (STYLE.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytest_spark.infra.finding import Finding
from pytest_spark.infra.human import DAY_S, human_duration
from pytest_spark.infra.preflight.probe import (
    CarrierCounters,
    ClockSample,
    GpuFacts,
    JournalFacts,
    SshAttempt,
)

# ---------------------------------------------------------------------- GPU visible


def check_gpu_visible(node: str, gpu: GpuFacts, min_gpus: int) -> Finding:
    """``nvidia-smi -L`` lists at least ``min_gpus`` GPUs (counts only: a GB10 reports
    its memory fields as [N/A])."""
    if gpu.gpus is None:
        return Finding.failed(
            f"nvidia-smi failed: {gpu.error}",
            f">= {min_gpus} GPU",
            node=node,
            message=(
                f"{node}: nvidia-smi -L failed ({gpu.error}); expected >= {min_gpus} GPU. "
                "The NVIDIA driver is missing or broken: check `nvidia-smi`, "
                "`dmesg | grep -i nvrm`; reinstall the driver or reboot"
            ),
        )
    count = len(gpu.gpus)
    procs = len(gpu.processes) if gpu.processes is not None else None
    if count < min_gpus:
        return Finding.failed(
            count,
            min_gpus,
            "GPUs",
            node=node,
            message=(
                f"{node}: nvidia-smi -L lists {count} GPU(s)"
                + (f" ({gpu.error})" if gpu.error else "")
                + f", expected >= {min_gpus}. The driver lost the GPU (look for Xid errors in "
                "`dmesg`); a reboot usually brings it back, then check `nvidia-smi`"
            ),
        )
    return Finding.passed(
        count,
        min_gpus,
        "GPUs",
        node=node,
        message=(
            f"{node}: {count} GPU(s), {procs if procs is not None else '?'} compute process(es)"
        ),
    )


# ---------------------------------------------------------------------------- clock


def check_clock_skew(samples: Sequence[ClockSample], max_skew_s: float) -> Finding:
    """The largest pairwise skew between node clocks, each read against the runner's
    clock at the midpoint of its round trip."""
    if len(samples) < 2:
        return Finding.passed(
            0.0,
            f"< {max_skew_s:g}",
            "s",
            message="fewer than two nodes answered: no skew to measure",
        )
    hi = max(samples, key=lambda s: s.offset_s)
    lo = min(samples, key=lambda s: s.offset_s)
    skew = round(hi.offset_s - lo.offset_s, 3)
    uncertainty = (hi.rtt_s + lo.rtt_s) / 2
    offsets = ", ".join(f"{s.node} {s.offset_s:+.3f} s" for s in samples)
    if skew >= max_skew_s:
        return Finding.failed(
            skew,
            f"< {max_skew_s:g}",
            "s",
            node=hi.node,
            message=(
                f"{hi.node} runs {skew:.3f} s ahead of {lo.node} (± {uncertainty:.3f} s; "
                f"offsets against the runner: {offsets}); expected < {max_skew_s:g} s. "
                "Sync the clocks: timedatectl set-ntp true, chronyc makestep (check "
                "`chronyc tracking` on every node)"
            ),
        )
    return Finding.passed(
        skew,
        f"< {max_skew_s:g}",
        "s",
        message=(
            f"max clock skew {skew:.3f} s (± {uncertainty:.3f} s) between {hi.node} and "
            f"{lo.node}; offsets against the runner: {offsets}"
        ),
    )


# ------------------------------------------------------------------------------ ssh


def check_passwordless_ssh(
    head: str, attempts: Sequence[SshAttempt], names: Mapping[str, str]
) -> Finding:
    """``ssh -o BatchMode=yes -o ConnectTimeout=5 ADDR true`` from the head to every
    worker address the launcher uses succeeds."""
    failed = [a for a in attempts if not a.ok]
    measured = {names.get(a.address, a.address): "ok" if a.ok else f"rc {a.rc}" for a in attempts}
    if not failed:
        return Finding.passed(
            measured,
            "ok to every worker",
            node=head,
            message=(f"{head}: passwordless SSH to {', '.join(measured) or 'no worker'} works"),
        )
    parts = []
    for a in failed:
        who = names.get(a.address, a.address)
        last = a.output.strip().splitlines()[-1] if a.output.strip() else f"exit {a.rc}"
        parts.append(f"{who} ({a.address}): {last}")
    hint = []
    text = " ".join(a.output for a in failed)
    if "Permission denied" in text:
        hint.append(
            f"install the head's key on the worker: ssh-copy-id WORKER (as the user "
            f"{head} runs the launcher as)"
        )
    if "Host key verification failed" in text or "host key" in text.lower():
        hint.append(
            "accept the worker's host key once on the head: ssh-keyscan WORKER >> "
            "~/.ssh/known_hosts (check the fingerprint)"
        )
    if not hint:
        hint.append(
            "check that the worker is reachable from the head on that address and "
            "that ssh-copy-id was run from the head"
        )
    return Finding.failed(
        measured,
        "ok to every worker",
        node=head,
        message=(
            f"{head}: passwordless SSH failed to {'; '.join(parts)}; expected "
            "`ssh -o BatchMode=yes WORKER true` to succeed (launch-cluster.sh stops at its "
            f"SSH check without it). Fix: {'; '.join(hint)}"
        ),
    )


# ------------------------------------------------------------------------- link flaps


def check_link_flaps(
    node: str,
    ifname: str,
    counters: CarrierCounters | None,
    uptime_s: float | None,
    journal: JournalFacts,
    max_flaps: int,
) -> Finding:
    """Fewer than ``max_flaps`` carrier losses on ``ifname`` per 24 h: journald's kernel
    lines about it when it has any, else sysfs carrier counters (since the netdev
    appeared) over the node's uptime."""
    lines = journal.about(ifname)
    losses = counters.losses if counters else None
    if lines:
        per_day: float = len(lines)
        source = f"journalctl -k: {len(lines)} link-down line(s) in the last 24 h"
        if losses is not None:
            source += f" (sysfs: {losses} carrier loss(es) since the netdev appeared)"
    elif losses is not None:
        up = uptime_s or 0.0
        if up <= DAY_S:
            per_day = float(losses)
            source = (
                f"sysfs carrier counters: {losses} carrier loss(es) since boot "
                f"{human_duration(up)} ago"
            )
        else:
            per_day = round(losses * DAY_S / up, 2)
            source = (
                f"sysfs carrier counters: {losses} carrier loss(es) in "
                f"{human_duration(up)} of uptime, {per_day:g} per 24 h on average"
            )
        if not journal.available:
            source += f"; kernel journal: {journal.error or 'empty'}"
    else:
        return Finding.failed(
            "unknown",
            f"< {max_flaps}",
            "per 24 h",
            node=node,
            message=(
                f"{node} {ifname}: no carrier counters in sysfs and no kernel journal lines "
                f"about it; expected < {max_flaps} carrier losses per 24 h to be measurable. "
                "Check that the interface exists (ip link)"
            ),
        )
    evidence = {"journal": "\n".join(lines[-20:])} if lines else {}
    if per_day >= max_flaps:
        return Finding.failed(
            per_day,
            f"< {max_flaps}",
            "per 24 h",
            node=node,
            evidence=evidence,
            message=(
                f"{node} {ifname}: {per_day:g} carrier losses per 24 h ({source}); expected "
                f"< {max_flaps}. The link flaps: reseat or replace the QSFP cable, check "
                f"`ethtool -S {ifname}` for symbol errors, and the port on the other end"
            ),
        )
    return Finding.passed(
        per_day,
        f"< {max_flaps}",
        "per 24 h",
        node=node,
        message=f"{node} {ifname}: {per_day:g} per 24 h ({source})",
    )


def check_reachable(
    node: str, target: str, error: str | None, *, host_key: bool = False
) -> Finding:
    """Reached over SSH, or unreachable with what usually fixes it (the one failure an
    unreachable node gives; the checks that need it skip citing it)."""
    if error is None:
        return Finding.passed(
            "reachable", "reachable", node=node, message=f"{node}: SSH to {target} works"
        )
    text = error
    while text.startswith(f"{node}: "):
        text = text.removeprefix(f"{node}: ")
    lowered = text.lower()
    if host_key:
        fix = (
            "the host key is unknown or changed: verify it and add it to known_hosts "
            "(ssh-keyscan), never disable the check"
        )
    elif "refused" in lowered:
        fix = (
            "the node answers but nothing listens for SSH: start sshd there "
            "(systemctl start ssh) or fix the port in the ssh_config"
        )
    elif "timed out" in lowered or "timeout" in lowered:
        fix = (
            "nothing answers at that address: check the node is powered on, its "
            "management cable and the address (--spark-head / --spark-workers)"
        )
    elif "auth" in lowered or "permission" in lowered:
        fix = "the key is not accepted: check IdentityFile and the node's authorized_keys"
    else:
        fix = "check the node, its management network and --spark-ssh-config"
    return Finding.failed(
        "unreachable",
        "reachable over SSH",
        node=node,
        message=(
            f"{node}: unreachable over SSH at {target}: {text}. Every check that needs "
            f"{node} is skipped citing this. Usual fix: {fix}"
        ),
    )
