"""The nodes are alike: image, container, driver and library versions compared across
nodes (``parse``, ``probe``, ``gather``, ``check``)."""
