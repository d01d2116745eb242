"""Known-bad versions: a node on a driver, kernel, DGX OS, ConnectX-7 firmware or NCCL
build the profile's deny list names, each with its public source."""
