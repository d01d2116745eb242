"""sparksim: a simulated N-node NVIDIA DGX Spark cluster (network namespaces, veth, tc,
one real sshd per node, fake RDMA/GPU tools). A product of its own: standard library
only, imports nothing from the rest of pytest_spark. Driven through the ``spark-sim`` CLI
(:mod:`pytest_spark.sim.cli`) and the cluster.json it writes; see docs/ARCHITECTURE.md."""
