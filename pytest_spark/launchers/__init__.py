"""Launching as a plug-in: what ``--spark-launch`` stands the serving cluster up with, one
interface (``base.ClusterLauncher``: describe, stand up, what to watch, the launcher's own
log, tear down) and one table of launchers by name (``registry``, ``--spark-launcher``).

Launchers: ``launch_cluster`` (eugr/spark-vllm-docker's launch-cluster.sh on the head, the
default) and ``sparkrun`` (the sparkrun CLI on this machine). ``containers``: the serving
containers' states on the nodes (docker inspect), read by launchers and checks alike.

The readiness watch (``pytest_spark.readiness``) calls a launcher only through the
interface; nothing here imports readiness.

May import: infra (gather, probe, parse), access, settings.
"""
