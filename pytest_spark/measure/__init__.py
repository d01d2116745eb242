"""Measurements once per session and alone on the cluster, also under xdist (``once``), the
cluster lock they take (``rwlock``) and the typed JSON through which xdist workers share
them (``codec``).

May import: access, settings.
"""
