"""The serving command: ``vllm serve`` arguments (``parse``), the server process read from
the node (``probe``, ``gather``) and its checks (``check``)."""
