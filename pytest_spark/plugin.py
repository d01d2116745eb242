"""pytest hooks and option wiring of pytest-dgx-spark (entry point ``spark``).

As pytest-xdist's ``DSession``: ``pytest_configure`` chooses the process's role once and
registers one plugin object for it (pytest_spark.roles): ``Controller`` (the session that
owns the sim, the run directory, the launched cluster, the results and the report) or
``Worker`` (an xdist worker, attached to the controller's sim and run directory). Not asked
for, it registers ``InactiveGuard`` instead and nothing else.
"""

from __future__ import annotations

import pytest

# Only what the inert path needs is imported here (options, the activation check, where
# the suite is and which checks need a cluster): installed but not asked for, the plugin
# must not cost the import of paramiko, testinfra and httpx. The roles (pytest_spark.roles)
# are imported once active. The stash keys (state) load with the entry point, not with the
# roles: they must be the same objects for every session of one process (pytester's
# in-process runs drop the modules first imported inside a run; a key made again is
# another key, and the next session's fixtures missed the settings).
from pytest_spark import hooks, state  # noqa: F401
from pytest_spark.settings.resolve import (
    SHOW_PROFILE,
    add_options,
    asked_for,
    refuse_spaced_paths,
)
from pytest_spark.suitedir import (
    CATEGORY_MARKERS,
    SPARK_FIXTURES,
    VERDICT_MARKERS,
    cluster_usage_error,
    item_fixtures,
    select_installed_suite,
)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hooks)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """--spark-show-profile: print the thresholds and exit 0, as --markers does, before any
    session, sim or connection exists."""
    if not config.getoption(SHOW_PROFILE):
        return None
    from pytest_spark.settings.show import show_profile

    return show_profile(config)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    refuse_spaced_paths(config)  # before anything is collected or contacted
    # The suite's markers are declared even when inactive (suitedir.CATEGORY_MARKERS).
    for name, meaning in {**CATEGORY_MARKERS, **VERDICT_MARKERS}.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")
    if asked_for(config) is None:  # installed, not asked for: a good neighbour
        config.pluginmanager.register(InactiveGuard(), "spark.inactive")
        return
    select_installed_suite(config)
    from pytest_spark.roles import Controller, Worker

    role = Worker(config) if hasattr(config, "workerinput") else Controller(config)
    config.pluginmanager.register(role, f"spark.{role.name}")  # first: unconfigure cleans up
    role.start()


class InactiveGuard:
    """Registered instead of everything else when the plugin is not asked for: tests that
    use the plugin's fixtures get a usage error saying how to ask for it; every other
    test runs exactly as without the plugin."""

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        needy = [i for i in items if item_fixtures(i) & SPARK_FIXTURES]
        if needy:
            raise cluster_usage_error(needy)
