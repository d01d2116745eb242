"""Open-file limits of each node's Docker engine, which its containers inherit (``parse``,
``probe``, ``gather``, ``check``)."""
