"""Readiness of the nodes and of serving: the launch or attach, once per session, with the
launcher driver and the teardown (``launch``), the startup watch (``watch``: log lines and
container state -> phases and a fail-fast verdict), the live wait (``wait``: what it
watches is one ``WaitSpec``), and, where present, node reachability (``reachability``: one
unreachable node, one error); and the parsers of what it reads: vLLM's log lines
(``vllm_log``) and ``ray status`` (``ray``).

May import: serving, infra (every role), access, settings.
"""
