"""The ConnectX-7 functions' PCIe links: each trained at the width and speed it is capable of."""
