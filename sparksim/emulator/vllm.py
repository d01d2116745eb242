"""``python3 -m sparksim.emulator.vllm serve ...``: the emulator under a command
line that reads like real vLLM's (``python3 /usr/local/bin/vllm serve ...``), so that a
process listing (``docker top``, ``ps``) shows ``vllm serve`` as it does on a Spark."""

from __future__ import annotations

import sys

from .__main__ import main

if __name__ == "__main__":
    sys.exit(main())
