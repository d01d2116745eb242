"""Pure parsers of command output: text in, typed facts out. No I/O.

May import: nothing else of pytest_spark.
"""
