"""The report's environment table (pytest-metadata): the cluster, its software and the
policies the run used, read from the settings and from what the checks and serving
recorded. Values are plain text; the HTML layer escapes them."""

from __future__ import annotations

from typing import Any

from pytest_spark.report.figures import as_dict
from pytest_spark.report.history import suite_version
from pytest_spark.report.summary import fmt_value

Value = str | dict[str, str]

# extra keys the checks may attach (first found wins); see the module's report notes.
MODEL_KEYS = ("model_id", "model", "served_model")
VLLM_KEYS = ("vllm_version",)
ARGS_KEYS = ("engine_args", "serve_args", "vllm_args")
NCCL_KEYS = ("nccl_version",)
DRIVER_KEYS = ("driver_version", "gpu_driver", "nvidia_driver")
FIRMWARE_KEYS = ("firmware", "firmware_version", "nic_firmware", "fw_version")


def _extras(doc: dict[str, Any], keys: tuple[str, ...]) -> list[tuple[str | None, Any]]:
    found = []
    for check in doc.get("checks") or ():
        extra = check.get("extra") or {}
        for key in keys:
            if isinstance(extra, dict) and extra.get(key) not in (None, "", {}, []):
                found.append((check.get("node"), extra[key]))
                break
    return found


def _per_node(found: list[tuple[str | None, Any]]) -> Value | None:
    values: dict[str, str] = {}
    for node, value in found:
        if isinstance(value, dict):
            for k, v in value.items():
                values.setdefault(f"{node} {k}" if node else str(k), fmt_value(v))
        else:
            values.setdefault(node or "cluster", fmt_value(value))
    if not values:
        return None
    distinct = set(values.values())
    if len(distinct) == 1 and len(values) > 1:
        return f"{distinct.pop()} (every node)"
    if len(values) == 1:
        node, value = next(iter(values.items()))
        return value if node == "cluster" else f"{value} ({node})"
    return values


def _model(doc: dict[str, Any], settings: Any) -> str | None:
    if getattr(settings, "model", None):
        return str(settings.model)
    found = _extras(doc, MODEL_KEYS)
    if found:
        return fmt_value(found[0][1])
    for check in doc.get("checks") or ():
        measured = check.get("measured")
        if (
            check.get("category") == "readiness"
            and isinstance(measured, dict)
            and measured.get("id")
        ):
            return str(measured["id"])
    for check in doc.get("checks") or ():
        sweep = (check.get("extra") or {}).get("sweep")
        if isinstance(sweep, dict) and isinstance(sweep.get("server"), str):
            return str(sweep["server"]).split(" at ", 1)[0]
    return None


def host_key_policy(settings: Any) -> str:
    policy = getattr(settings, "hostkey_check", "strict")
    if policy == "off":
        source = settings.source("hostkey_check") if hasattr(settings, "source") else "?"
        return (
            "OFF: ANY HOST KEY IS ACCEPTED (--spark-hostkey-check off, from "
            f"{source}); a changed or spoofed node would not be noticed"
        )
    return "strict: unknown or changed host keys are errors"


def environment(
    doc: dict[str, Any], settings: Any, commit: dict[str, Any] | None
) -> dict[str, Value]:
    cluster = as_dict(doc.get("cluster"))
    serving = as_dict(doc.get("serving"))
    facts = as_dict(serving.get("facts"))
    env: dict[str, Value] = {}
    if cluster.get("sim"):
        env["Cluster"] = "sparksim: the embedded SIMULATED cluster (not real hardware)"
    elif cluster.get("head"):
        env["Cluster"] = f"DGX Spark cluster, head {cluster['head']}"
    else:
        env["Cluster"] = "none given (no --spark-head, --spark-sim or --spark-api-url)"
    nodes = {
        str(n.get("name")): f"{n.get('role')}, {n.get('address')}"
        for n in cluster.get("nodes") or ()
    }
    if nodes:
        env["Cluster nodes"] = nodes
    profile = cluster.get("profile") or getattr(getattr(settings, "profile", None), "name", "")
    source = settings.source("profile") if hasattr(settings, "source") else ""
    env["Threshold profile"] = f"{profile} ({source})" if source else str(profile)
    env["SSH host-key policy"] = host_key_policy(settings)
    env["Model"] = _model(doc, settings) or "unknown: no serving check recorded it"
    version = _extras(doc, VLLM_KEYS)
    env["vLLM version"] = (
        fmt_value(version[0][1])
        if version
        else facts.get("version") or "unknown: no serving check recorded it"
    )
    args = getattr(settings, "serve_args", None)
    found_args = _extras(doc, ARGS_KEYS)
    env["vLLM engine args"] = (
        str(args)
        if args
        else fmt_value(found_args[0][1])
        if found_args
        else "unknown: attached to a running server (give --spark-serve-args to record them)"
    )
    if facts:
        env["vLLM startup facts"] = {k: str(v) for k, v in facts.items() if k != "version"}
        if not env["vLLM startup facts"]:
            del env["vLLM startup facts"]
    for label, keys, who in (
        ("NCCL version", NCCL_KEYS, "test_serving_image_alike or the all-reduce check"),
        ("GPU driver", DRIVER_KEYS, "the preflight checks"),
        ("ConnectX firmware", FIRMWARE_KEYS, "test_fabric_twins_up (ibstat)"),
    ):
        env[label] = _per_node(_extras(doc, keys)) or f"unknown: not recorded by {who}"
    suite = f"pytest-dgx-spark {suite_version()}"
    if commit:
        suite += f", commit {commit.get('short')}" + (" (modified)" if commit.get("dirty") else "")
    env["Suite"] = suite
    return env
