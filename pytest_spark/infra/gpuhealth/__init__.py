"""GPU health per node: temperature, clock event reasons, persistence mode, the kernel log's
Xid / NVRM errors (``parse``, ``probe``, ``check``; gathered with the preflight probe)."""
