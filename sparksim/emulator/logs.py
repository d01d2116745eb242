"""Log lines in vLLM's shapes, written to stdout and flushed line by line.

``(APIServer pid=1) INFO 11-29 16:32:46 [api_utils.py:286] non-default args: {...}``;
uvicorn's own ``INFO:     ...`` lines; tqdm progress bars as vLLM's loaders print them.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import TextIO

PY_SITE = "/usr/local/lib/python3.12/dist-packages"


def frame(module: str, line: int, func: str) -> str:
    """One ``File ...`` line of a Python traceback inside vLLM's install."""
    return f'  File "{PY_SITE}/vllm/{module}", line {line}, in {func}'


class Log:
    """Thread-safe line writer; every line is flushed at once (a log follower sees it)."""

    def __init__(self, stream: TextIO | None = None, clock: Callable[[], float] = time.time):
        self._stream = stream if stream is not None else sys.stdout
        self._lock = threading.Lock()
        self._clock = clock

    def raw(self, text: str) -> None:
        with self._lock:
            for line in text.split("\n"):
                self._stream.write(line + "\n")
            self._stream.flush()

    def stamp(self) -> str:
        return time.strftime("%m-%d %H:%M:%S", time.localtime(self._clock()))

    def vllm(self, prefix: str, level: str, where: str, message: str) -> None:
        """vLLM's formatter repeats the header on every line of a multi-line message."""
        head = f"{prefix} {level} {self.stamp()} [{where}] "
        self.raw("\n".join(head + line for line in message.split("\n")))

    def info(self, prefix: str, where: str, message: str) -> None:
        self.vllm(prefix, "INFO", where, message)

    def warning(self, prefix: str, where: str, message: str) -> None:
        self.vllm(prefix, "WARNING", where, message)

    def error(self, prefix: str, where: str, message: str) -> None:
        self.vllm(prefix, "ERROR", where, message)

    def uvicorn(self, message: str) -> None:
        self.raw(f"INFO:     {message}")

    def access(self, client: tuple[str, int], method: str, path: str, status: int) -> None:
        phrase = HTTPStatus(status).phrase
        self.uvicorn(f'{client[0]}:{client[1]} - "{method} {path} HTTP/1.1" {status} {phrase}')


def fmt_interval(seconds: float) -> str:
    """tqdm's elapsed/remaining format: ``MM:SS`` or ``H:MM:SS``."""
    total = int(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def fmt_rate(n: int, elapsed: float) -> str:
    if n <= 0 or elapsed <= 0:
        return "?it/s"
    rate = n / elapsed
    return f"{1 / rate:5.2f}s/it" if rate < 1 else f"{rate:5.2f}it/s"


def tqdm_times(n: int, total: int, elapsed: float) -> str:
    if n <= 0 or elapsed <= 0:
        return f"[{fmt_interval(elapsed)}<?, ?it/s]"
    remaining = (total - n) * elapsed / n
    return f"[{fmt_interval(elapsed)}<{fmt_interval(remaining)}, {fmt_rate(n, elapsed)}]"


def shard_progress(n: int, total: int, elapsed: float) -> str:
    """``Loading safetensors checkpoint shards:  56% Completed | 5/9 [00:13<00:11,  2.87s/it]``"""
    pct = 100.0 * n / total if total else 100.0
    return (
        f"Loading safetensors checkpoint shards: {pct:3.0f}% Completed | {n}/{total} "
        f"{tqdm_times(n, total, elapsed)}"
    )


def bar_progress(desc: str, n: int, total: int, elapsed: float, width: int = 10) -> str:
    """``Capturing CUDA graphs (decode, FULL): 100%|##########| 35/35 [00:01<00:00, 33.86it/s]``"""
    frac = n / total if total else 1.0
    filled = int(frac * width)
    bar = "#" * filled + " " * (width - filled)
    return f"{desc}: {100 * frac:3.0f}%|{bar}| {n}/{total} {tqdm_times(n, total, elapsed)}"
