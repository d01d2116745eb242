"""What the serving ranks really loaded: the NCCL library each rank process mapped (its
ELF Build ID), the rank's own environment, and a hash of the installed vllm package tree."""
