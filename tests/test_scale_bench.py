"""benchmarks/scale.py's reading of a run: the failed and errored checks counted by test
function, so a size's expected failures (light nodes have no Docker engine: one per node)
are told apart from what the machine lost (pings at full CPU)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCALE = Path(__file__).resolve().parents[1] / "benchmarks" / "scale.py"


def load() -> ModuleType:
    if str(SCALE.parent) not in sys.path:  # as `python benchmarks/scale.py` has it (common.py)
        sys.path.append(str(SCALE.parent))
    spec = importlib.util.spec_from_file_location("bench_scale", SCALE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_scale"] = module
    spec.loader.exec_module(module)
    return module


def test_failures_counted_by_function_parameters_dropped() -> None:
    stdout = "\n".join(
        [
            "...F.E",
            "FAILED tests_infra/test_preflight.py::test_docker_ready[spark-1] - Failed: x",
            "FAILED tests_infra/test_preflight.py::test_docker_ready[spark-2] - Failed: y",
            "ERROR tests_infra/test_preflight.py::test_serving_env_matches_fabric[spark-1]",
            "FAILED tests_infra/test_links.py::test_ping_peer_at_full_mtu[spark-1-twin0] - z",
            "FAILED tests_infra/test_alike.py::test_clock_ntp_synchronized",
            "2 failed, 65 deselected, 2 errors in 2.23s",
        ]
    )
    assert load()._failures(stdout) == [
        "1 x ERROR tests_infra/test_preflight.py::test_serving_env_matches_fabric",
        "1 x FAILED tests_infra/test_alike.py::test_clock_ntp_synchronized",
        "1 x FAILED tests_infra/test_links.py::test_ping_peer_at_full_mtu",
        "2 x FAILED tests_infra/test_preflight.py::test_docker_ready",
    ]
