"""The serving client: talking to an OpenAI-compatible API and recording what it said.

``chat`` (``ServingClient``, the turn cache), ``stream`` (SSE read exactly, every request
bounded in time), ``sdk`` (the same turns through the openai SDK), ``turn`` (a reply as one
``Turn``), ``wire`` (version-dependent wire facts: reasoning field, error body, /metrics
text) and ``evidence`` (the raw exchange a finding quotes).

May import: nothing else of ``serving``.
"""
