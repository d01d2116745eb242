"""NCCL over the fabric: all_reduce_perf / NCCL_DEBUG output (``parse``), what a collective
run brought back (``probe``), the run and the GID tables per node (``gather``), the busbw and
transport checks (``check``; a low busbw read against the failure signatures:
``signature_check``), the other collectives' sweeps (``collectives_check``) and the
RoCE GID choice (``gid_parse``, ``gid_check``). The collective run itself: the shell commands
it sends (``command_probe``), rank 0's output read as results and progress
(``result_probe``), the launcher chosen (``launcher_gather``), the run (``runner_gather``)
and the benchmark shipped to the nodes (``scripts/``)."""
