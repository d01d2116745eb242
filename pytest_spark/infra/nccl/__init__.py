"""NCCL over the fabric: all_reduce_perf / NCCL_DEBUG output (``parse``), what a collective
run brought back (``probe``), the run and the GID tables per node (``gather``), the busbw and
transport checks (``check``), the other collectives' sweeps (``collectives_check``) and the
RoCE GID choice (``gid_parse``, ``gid_check``)."""
