"""Readiness of the nodes and of serving: the launch or attach, once per session, and the
teardown (``launch``: the launcher is a plug-in of ``pytest_spark.launchers``, called only
through its interface), the nodes that serve a rank (``ranks``), attach's first look
(``attach``), the startup watch (``watch``: log lines and container state -> phases and a
fail-fast verdict), the live wait (``wait``: the transitions and ``wait_ready``; what it
watches is one ``WaitSpec``, its state ``waitstate``, its verdicts ``verdicts``, its time
``clock``; one round trip per node and poll is ``probe``, read by ``parse``), and, where
present, node reachability (``reachability``: one unreachable node, one error); and the
parsers of what it reads: vLLM's log lines (``vllm_log``) and ``ray status`` (``ray``).

May import: launchers, serving, infra (every role), access, settings.
"""
