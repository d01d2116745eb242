"""Root conftest: the plugin's own tests use pytester; the suite needs nothing here."""

pytest_plugins = ["pytester"]
