"""Session state kept in ``config.stash`` (never ``config._something``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pathlib import Path

    from pytest_spark.standup import ServingInfo
    from pytest_spark.cluster import Cluster
    from pytest_spark.results import ResultsRecorder
    from pytest_spark.settings import Settings
    from pytest_spark.simcontrol import SimCluster

SETTINGS_KEY = pytest.StashKey["Settings"]()
CLUSTER_KEY = pytest.StashKey["Cluster"]()
SIM_KEY = pytest.StashKey["SimCluster"]()
RESULTS_KEY = pytest.StashKey["ResultsRecorder"]()
RUN_DIR_KEY = pytest.StashKey["Path"]()
SERVING_KEY = pytest.StashKey["ServingInfo"]()
