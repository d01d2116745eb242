"""The infra checks, one folder per topic (``links``, ``preflight``, ``memory``, ``alike``,
``gpuhealth``, ``nccl``, ``modelhash``, ``server``), each file named by its role:

- ``parse.py``: command output -> typed values; pure, no I/O;
- ``probe.py``: the probe command a node runs in one round trip, and the facts read from
  its output; no I/O (the caller runs the command);
- ``gather.py``: runs the probes on the nodes, cached for the session;
- ``check.py``: facts and thresholds -> :class:`~pytest_spark.infra.finding.Finding`;
  pure, no pytest.

A topic with two parts names the second by role too (``nccl/gid_parse.py``,
``nccl/gid_check.py``, ``nccl/collectives_check.py``). Shared pieces sit in neutral
modules: ``errors`` (:class:`~pytest_spark.infra.errors.ParseError`), ``probe`` (the probe
framing), ``roundtrip`` (the probes that share a node's one round trip) and ``finding``.

May import, by role (tests/test_import_graph.py): parse nothing; probe parse (and
settings); check probe, parse and settings; gather everything above plus collective and
access. Only gather imports pytest.
"""
