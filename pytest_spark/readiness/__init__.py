"""Readiness of the nodes and of serving: the launcher driver (``launch``), the startup watch
(``watch``: log lines and container state -> phases and a fail-fast verdict), the live wait
(``wait``), the once-per-session launch or attach with its teardown (``session``), and,
where present, node reachability (``reachability``: one unreachable node, one error).

May import: serving, gathering, checks, facts, parsers, access, settings.
"""
