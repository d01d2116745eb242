"""Serving validators: what the server sent, judged into ``Finding``s with raw evidence.

Pure validators (``tools``, ``reasoning``, ``structured``, ``schema``, ``sdkchecks``,
``accuracy``, ``fingerprint``, ``mathset``), the verdicts that cite one root cause
(``causes``), and the request sets that feed them, one per suite file (``canary``,
``toolturns``, ``formatturns``, ``accuracyprobe``, ``context``).

May import: ``serving.client`` and ``serving.load``.
"""
