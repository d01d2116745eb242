"""sparksim: a simulated N-node NVIDIA DGX Spark cluster (network namespaces, veth, tc,
one real sshd per node, fake RDMA/GPU tools). A product of its own: standard library
only, imports nothing of pytest_spark. Driven through the ``spark-sim`` CLI
(:mod:`sparksim.cli`) and the cluster.json it writes; see docs/ARCHITECTURE.md."""
