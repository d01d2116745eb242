"""``python3 -m sparksim.emulator.vllm serve ...``: the emulator's ``vllm`` entry point.
The serving image runs it as vLLM's console script (``python3 /opt/vllm/bin/vllm serve
...``, see sparksim/image.py), so a process listing shows ``vllm serve`` as on a Spark."""

from __future__ import annotations

import sys

from .__main__ import main

if __name__ == "__main__":
    sys.exit(main())
