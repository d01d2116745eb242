"""The faults ``spark-sim fault KIND ...`` injects into a running sim, one module per area:
``link`` (fabric link state, rate and MTU, a cable flapping during the run; ``clear``
resets state.json and faults.json), ``host`` (docker, GPU visibility, disk, clock, SSH,
NCCL socket, link flaps), ``fabric`` (RoCE GIDs, link delay), ``rdma`` (no RDMA drivers),
``gpu`` (Xid, throttle, clocks, temperature, and the kernel log's NV_ERR_NO_MEMORY, PCIe
AER and the previous boot), ``mem`` (memory held), ``alike`` (driver, NTP, NCCL build),
``reach`` (a node unreachable), ``serving`` (stale container, killed worker, emulator
faults, a differing checkpoint) and ``perturb`` (a perturbed model). Each has ``KINDS``,
``add_parsers(kinds)``, ``apply(state_dir, topo, args)`` and ``clear(state_dir, topo)``;
``common`` holds what they share: the record in faults.json and the argparse of their
kinds.

Nothing is imported here: the modules depend on the sim core (node, serving, ...), which
reads the record through ``common`` alone.
"""
