"""Session-cached gathering for the suite: link facts (``links``), preflight facts
(``preflight``), the collective run (``nccl``), measurements once per session and alone on
the cluster (``measure``, with ``rwlock``; what xdist workers share goes through
``parsers.codec``). It decides no skips: which check skips on a fact (a down fabric twin,
``fixtures.require_unless_twin_down``) is decided by the fixtures and the checks.

May import: collective, checks, facts, parsers, access, settings.
"""
