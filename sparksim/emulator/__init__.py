"""vLLM emulator: a stand-in for ``vllm serve`` that speaks vLLM's wire format.

Standard library only: it runs inside a minimal container with a bind-mounted Python.
All imports inside the package are relative, so it runs both as
``python -m sparksim.emulator`` and, with ``PYTHONPATH=.../sparksim``,
as ``python -m emulator`` (without the rest of sparksim).

Subcommands: ``serve MODEL [vLLM flags]``, ``worker --head-addr IP --port P``,
``ray status``. Emulator-only knobs come from ``SPARKSIM_EMU_*`` environment variables
(see ``config.Knobs``) and a JSON control file (``SPARKSIM_EMU_CONTROL``).
"""

DEFAULT_VERSION = "0.32.0"
