"""The infra checks, one folder per topic (``links``, ``pcie``, ``preflight``, ``memory``,
``alike``, ``gpuhealth``, ``gpuload``, ``kernel``, ``counters``, ``fdlimit``, ``loaded``,
``nccl``, ``modelhash``, ``server``), each file named by its role:

- ``parse.py``: command output -> typed values; pure, no I/O;
- ``probe.py``: the probe command a node runs, the facts read from its output, and its
  declaration (``HOST_PROBE``: :class:`~pytest_spark.infra.hostprobe.HostProbe`); no I/O
  (the caller runs the command);
- ``gather.py``: runs the probes on the nodes, cached for the session (a topic whose
  suite file reads its one probe with ``roundtrip.gather_probe`` needs none);
- ``check.py``: facts and thresholds -> :class:`~pytest_spark.infra.finding.Finding` or
  ``Skip``; pure, no pytest.

A topic with several subjects names each file by subject and role (``nccl/gid_parse.py``,
``links/mtu_check.py``, ``alike/knownbad_check.py``). A topic imports no other topic
(tests/test_import_graph.py: TOPIC_ALLOWED lists the few pairs that need another's facts,
with why). Shared pieces sit in neutral modules: ``errors``, ``finding`` (Finding,
CheckNote, Skip), ``human`` (the formats messages share), ``probe`` (the probe framing),
``hostprobe`` (the declaration), ``roundtrip`` (collects the declarations, runs the shared
ones in one round trip per node), ``kernellog``, ``serveargs``, ``servecmd``, ``smi`` and
``modelfiles``.

May import, by role (tests/test_import_graph.py): parse nothing; probe parse (and
settings); check probe, parse and settings; gather everything above plus access. Only
gather imports pytest.
"""
