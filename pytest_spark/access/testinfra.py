"""testinfra ``host`` objects that run over the suite's own SSH connections."""

from __future__ import annotations

from typing import Any

import testinfra.host
from testinfra.backend import base

from pytest_spark.access.base import Runner


class SparkBackend(base.BaseBackend):
    """A testinfra backend that reuses one of our SSH connections (no new logins)."""

    NAME = "spark"

    def __init__(self, name: str, runner: Runner, **kwargs: Any) -> None:
        self._name = name
        self._runner = runner
        super().__init__(name, **kwargs)

    def get_hostname(self) -> str:
        return self._name

    def get_pytest_id(self) -> str:
        return self._name

    def run(self, command: str, *args: str, **kwargs: Any) -> base.CommandResult:
        cmd = self.get_command(command, *args)
        result = self._runner.run(cmd)
        return self.result(
            result.rc, self.encode(cmd), result.stdout.encode(), result.stderr.encode()
        )


def testinfra_host(name: str, runner: Runner) -> testinfra.host.Host:
    return testinfra.host.Host(SparkBackend(name, runner))
