"""The nodes are alike: image, container, driver and library versions compared across
nodes (``parse``, ``probe``, ``gather``, ``check``), and none of them a known-bad version
the profile's deny list names (``knownbad_parse``, ``knownbad_check``: one probe, two
verdicts)."""
