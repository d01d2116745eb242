"""The wiring's session state in ``config.stash`` (never ``config._something``): the keys
whose values the plugin and the fixtures make (settings, run directory, simulated cluster,
connected cluster).

A key whose value a part owns lives with that part: ``MEASURE_KEY`` in
``measure.once``, ``RESULTS_KEY`` in ``report.results``, ``REACHABILITY_VERDICT_KEY``
in ``readiness.reachability``, ``SERVING_VERDICT_KEY`` in ``readiness.serving``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pathlib import Path

    from pytest_spark.access.cluster import Cluster
    from pytest_spark.access.simcontrol import SimCluster
    from pytest_spark.settings.resolve import Settings

SETTINGS_KEY: pytest.StashKey[Settings] = pytest.StashKey()
CLUSTER_KEY: pytest.StashKey[Cluster] = pytest.StashKey()
SIM_KEY: pytest.StashKey[SimCluster] = pytest.StashKey()
RUN_DIR_KEY: pytest.StashKey[Path] = pytest.StashKey()
