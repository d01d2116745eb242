"""The model's files hash the same on every node (``probe``, ``gather``)."""
