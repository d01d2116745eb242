"""Session-cached gathering for the suite: link facts (``links``), preflight facts
(``preflight``), the collective run (``nccl``), measurements once per session and alone on
the cluster (``measure``, with ``rwlock``; what xdist workers share goes through
``parsers.codec``).

May import: collective, checks, facts, parsers, access, settings.
"""
