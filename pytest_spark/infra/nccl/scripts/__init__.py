"""The collective benchmark shipped to the nodes and run there by every rank:
``allreduce_probe`` (the program), ``table_probe`` (nccl-tests' table format) and
``predict_probe`` (the transport NCCL would select, for gloo runs). Standalone (stdlib, plus
torch): they import nothing of pytest_spark, only one another, and
``command_probe.script_text`` bundles them into the one program a rank runs.
"""
