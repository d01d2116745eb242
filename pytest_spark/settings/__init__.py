"""Settings: the options table (``options``), their resolution from command line, ini,
environment and profile into a frozen ``Settings`` (``resolve``), and the threshold
profiles (``profiles``, built-ins in ``profiles/*.toml``).

May import: nothing else of pytest_spark (every other part reads settings).
"""
