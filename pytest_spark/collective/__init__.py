"""The all-reduce benchmark: the runner (``runner``) and the scripts shipped to the nodes
(``allreduce``; ``script.script_text`` reads their text). The shipped scripts are standalone
(stdlib, plus torch): they import nothing of pytest_spark.

May import: infra's check, probe and parse modules, access, settings.
"""
