"""Pure parsers of command output: text in, typed facts out; and ``codec``, typed
dataclasses to JSON data and back (what xdist workers share: measurements, serving errors).
No I/O.

May import: nothing else of pytest_spark.
"""
