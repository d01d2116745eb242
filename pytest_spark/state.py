"""Session state kept in ``config.stash`` (never ``config._something``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pathlib import Path

    from pytest_spark.access.cluster import Cluster
    from pytest_spark.access.simcontrol import SimCluster
    from pytest_spark.gathering.measure import Measurements
    from pytest_spark.readiness.session import ServingInfo
    from pytest_spark.report.results import ResultsRecorder
    from pytest_spark.settings.resolve import Settings

SETTINGS_KEY: pytest.StashKey[Settings] = pytest.StashKey()
CLUSTER_KEY: pytest.StashKey[Cluster] = pytest.StashKey()
SIM_KEY: pytest.StashKey[SimCluster] = pytest.StashKey()
RESULTS_KEY: pytest.StashKey[ResultsRecorder] = pytest.StashKey()
RUN_DIR_KEY: pytest.StashKey[Path] = pytest.StashKey()
SERVING_KEY: pytest.StashKey[ServingInfo] = pytest.StashKey()
MEASURE_KEY: pytest.StashKey[Measurements] = pytest.StashKey()
# Whether a spark_serving_verdict check (test_cluster_serving) runs in this session: only
# then may the checks that need the server skip when it is down (else they must fail).
SERVING_VERDICT_KEY: pytest.StashKey[bool] = pytest.StashKey()
