"""The emulated model's reasoning: a few general rules that answer what a prompt asks.

A healthy model answers simple questions right, and the suite's accuracy checks depend on
that, so the emulator models it honestly: answers are derived from the prompt by rules
(arithmetic on the integers and operators it writes, counting between two numbers,
copying or reversing a quoted word, sorting a list of numbers, grade-school word problems
of gains, losses and groups), never looked up. A question no rule reads gets None (the
caller's canned and generic answers).

``garbled``: what a numerically broken model says instead (a corrupt all-reduce, a broken
kernel): fluent, the same shape, wrong. "12 + 7" then gives "12 + 7 = 12", as the real
perturbed SmolLM2 on vLLM did (issue #24).
"""

from __future__ import annotations

import re

_INT = r"-?\d+"
_EXPR = re.compile(r"(?:what is|compute|calculate)\s+((?:\d+\s*[-+*x/]\s*)+\d+)", re.I)
_COUNT = re.compile(r"count from (\d+) to (\d+)", re.I)
_COPY = re.compile(r"repeat (?:this|the) (?:string|word)[^:]*:\s*(\S+)", re.I)
_REVERSE = re.compile(r"write the (?:string|word) (\S+) backwards", re.I)
_SORT = re.compile(r"sort these numbers[^:]*:\s*((?:\d+\s*,\s*)+\d+)", re.I)
_GAIN = re.compile(r"\b(?:has|had|gets|finds|buys|receives|wins)\b", re.I)
_LOSS = re.compile(r"\b(?:gives away|gives|loses|eats|sells|spends)\b", re.I)


def _tokens(expr: str) -> list[str]:
    return re.findall(r"\d+|[-+*x/]", expr)


def evaluate(expr: str) -> int | None:
    """An integer expression with + - * (or x) and exact /, precedence as written math."""
    toks = _tokens(expr)
    if not toks or len(toks) % 2 == 0:
        return None
    terms: list[int] = [int(toks[0])]
    ops: list[str] = []
    for op, num in zip(toks[1::2], toks[2::2], strict=True):
        value = int(num)
        if op in "*x":
            terms[-1] *= value
        elif op == "/":
            if value == 0 or terms[-1] % value:
                return None
            terms[-1] //= value
        else:
            ops.append(op)
            terms.append(value)
    total = terms[0]
    for op, value in zip(ops, terms[1:], strict=True):
        total = total + value if op == "+" else total - value
    return total


def word_problem(prompt: str) -> int | None:
    """Gains, losses and groups in sentences: "has 12", "gets 9 more", "gives away 2",
    "buys 3 boxes ... with 4 ... in each box", "gives 3 ... to each of 4 friends"."""
    if "how many" not in prompt.lower():
        return None
    total: int | None = None
    for sentence in re.split(r"(?<=[.?!])\s+", prompt):
        numbers = [int(n) for n in re.findall(r"\d+", sentence)]
        if not numbers or sentence.lower().startswith("how many"):
            continue
        low = sentence.lower()
        groups = re.search(r"(\d+) \w+ of \w+ with (\d+) \w+ in each", low)
        each_of = re.search(r"gives (\d+) \w+ to each of (\d+)", low)
        amount = numbers[0]
        if groups:
            amount = int(groups.group(1)) * int(groups.group(2))
            rest = [int(n) for n in re.findall(r"\d+", low[groups.end() :])]
            total = (
                (total or 0) + amount + (rest[0] if "had" in low[groups.end() :] and rest else 0)
            )
            continue
        if each_of:
            has = re.search(r"has (\d+)", low)
            if has:
                total = int(has.group(1))
            total = (total or 0) - int(each_of.group(1)) * int(each_of.group(2))
            continue
        gain, loss = _GAIN.search(sentence), _LOSS.search(sentence)
        if gain and loss and gain.start() < loss.start() and len(numbers) >= 2:
            total = (total or 0) + numbers[0] - numbers[1]
        elif loss and not gain:
            total = (total or 0) - amount
        elif gain:
            total = (total or 0) + amount
    return total


def solve(prompt: str) -> str | None:
    """The right answer to what ``prompt`` asks, or None when no rule reads it."""
    if m := _EXPR.search(prompt):
        value = evaluate(m.group(1))
        return None if value is None else str(value)
    if m := _COUNT.search(prompt):
        low, high = int(m.group(1)), int(m.group(2))
        if 0 <= high - low <= 200:
            return " ".join(str(i) for i in range(low, high + 1))
    if m := _COPY.search(prompt):
        return m.group(1).strip("\"'`.,")
    if m := _REVERSE.search(prompt):
        return m.group(1).strip("\"'`.,")[::-1]
    if m := _SORT.search(prompt):
        return ", ".join(str(n) for n in sorted(int(x) for x in re.findall(r"\d+", m.group(1))))
    value = word_problem(prompt)
    return None if value is None else str(value)


def garbled(prompt: str) -> str | None:
    """What a numerically broken model answers instead: the same shape, wrong."""
    if m := _EXPR.search(prompt):
        expr = " ".join(m.group(1).split())
        return f"{expr} = {_tokens(expr)[0]}"
    if m := _COUNT.search(prompt):
        low = int(m.group(1))
        return " ".join(str(low + (i * 2) % 7) for i in range(6))
    if m := _COPY.search(prompt):
        word = m.group(1).strip("\"'`.,")
        return word[1:] + word[:1]
    if m := _REVERSE.search(prompt):
        return m.group(1).strip("\"'`.,")
    if m := _SORT.search(prompt):
        return m.group(1)
    value = word_problem(prompt)
    if value is not None:  # the first count it read, or (when that is the answer) one more
        first = int(re.findall(r"\d+", prompt)[0])
        return f"{first if first != value else value + 1} in all."
    return None
