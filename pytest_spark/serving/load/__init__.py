"""Serving load: the closed-loop concurrency sweep (``sweep``, run once per session by
``closedloop``), the open-loop sweep (``openloop``), the soak (``soak``), SLOs and goodput
(``slo``), percentiles (``stats``), ``/metrics`` snapshots (``metricsnap``) and the specs
read from the threshold profile (``specs``).

May import: ``serving.client``.
"""
