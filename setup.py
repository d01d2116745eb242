"""The package list, computed: every folder of pytest_spark and sparksim (data-only folders
too: setuptools wants the profiles, templates, launcher and tools folders listed) and the
suite folders pyproject.toml maps into the package. Everything else is in pyproject.toml;
a new topic folder under pytest_spark/infra needs no line anywhere."""

from setuptools import find_namespace_packages, setup

PRODUCT = ["pytest_spark", "pytest_spark.*", "sparksim", "sparksim.*"]
SUITE = ["pytest_spark.suite.tests_infra", "pytest_spark.suite.tests_e2e"]  # package-dir

setup(
    packages=[
        *(p for p in find_namespace_packages(include=PRODUCT) if "__pycache__" not in p),
        *SUITE,
    ]
)
