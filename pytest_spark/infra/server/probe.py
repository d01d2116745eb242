"""TEMPORARY (issue #37 integration): moved to pytest_spark.infra.servecmd."""

from pytest_spark.infra.servecmd import *  # noqa: F403
from pytest_spark.infra.servecmd import ServerCommand, parse_serve_args_text  # noqa: F401
