"""TEMPORARY (issue #37 integration): moved to pytest_spark.infra.serveargs."""

from pytest_spark.infra.serveargs import *  # noqa: F403
from pytest_spark.infra.serveargs import mode_of_processes, parse_serve_args  # noqa: F401
