"""The kernel log beyond the GPU driver's lines: the previous boot (did it end cleanly,
what it logged near its end) and PCIe AER errors on the ConnectX-7 functions."""
