"""Pure evaluation of facts against thresholds: no I/O, no pytest.

May import: parsers, facts, settings.
"""
