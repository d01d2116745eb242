"""Unified-memory headroom and who holds the GPU (``parse``, ``probe``, ``gather``,
``check``)."""
