"""pytest-dgx-spark: check multi-node vLLM clusters on NVIDIA DGX Spark with pytest.

Import name ``pytest_spark`` (PyPI's unrelated ``pytest-spark`` PySpark plugin uses the
same import name: do not install both in one environment).
"""

from pytest_spark.checks.base import Finding
from pytest_spark.cluster import Cluster, Node
from pytest_spark.fixtures import SparkCheck, SparkCheckWarning
from pytest_spark.profiles import Profile, load_profile
from pytest_spark.remote.base import (
    CommandFailed,
    CommandResult,
    CommandTimeout,
    HostKeyError,
    NodeUnreachable,
    RemoteError,
)
from pytest_spark.settings import Settings

__version__ = "0.1.0"

__all__ = [
    "Cluster",
    "CommandFailed",
    "CommandResult",
    "CommandTimeout",
    "Finding",
    "HostKeyError",
    "Node",
    "NodeUnreachable",
    "Profile",
    "RemoteError",
    "Settings",
    "SparkCheck",
    "SparkCheckWarning",
    "__version__",
    "load_profile",
]
