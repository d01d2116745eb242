"""Settings: the options table (``options``), their resolution from command line, ini,
environment and profile into a frozen, typed ``Settings`` (``resolve``: one field per
option, and where each value came from), and the threshold profiles (``profiles``: one
typed section per TOML table, validated on load; built-ins in ``profiles/*.toml``), and
``--spark-show-profile`` (``show``: every threshold in effect, its unit and its source).

May import: nothing else of pytest_spark (every other part reads settings).
"""
