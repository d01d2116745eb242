"""The math set (opt-in, pure): seeded grade-school word problems with exact integer
answers, scored against the profile's expected accuracy within a tolerance, as vLLM's
``tests/evals/gsm8k`` gates its releases (tolerance 0.08).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from pytest_spark.infra.finding import Finding
from pytest_spark.serving.validate.accuracy import SEED, advice, clip, integers_in

NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Femi", "Gita", "Hugo", "Ines", "Joss")
ITEMS = ("apples", "books", "marbles", "stickers", "pencils", "shells", "cards", "coins")


@dataclass(frozen=True)
class Problem:
    question: str
    answer: int


def math_problems(n: int, seed: int = SEED) -> list[Problem]:
    """``n`` seeded grade-school word problems, each with one exact integer answer (two
    or three steps of +, - and x; every intermediate count positive)."""
    rng = random.Random(seed + 1)
    out: list[Problem] = []
    for _ in range(n):
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        start = rng.randint(5, 40)
        shape = rng.randrange(3)
        if shape == 0:
            more, less = rng.randint(3, 30), rng.randint(1, 5)
            less = min(less, start + more - 1)
            q = (
                f"{name} has {start} {item}. {name} gets {more} more and then gives away "
                f"{less}. How many {item} does {name} have now?"
            )
            answer = start + more - less
        elif shape == 1:
            boxes, each, extra = rng.randint(2, 9), rng.randint(3, 12), rng.randint(1, 20)
            q = (
                f"{name} buys {boxes} boxes of {item} with {each} {item} in each box, and "
                f"already had {extra} {item}. How many {item} does {name} have now?"
            )
            answer = boxes * each + extra
        else:
            friends, each = rng.randint(2, 6), rng.randint(2, 8)
            total = friends * each + rng.randint(1, 15)
            q = (
                f"{name} has {total} {item} and gives {each} {item} to each of {friends} "
                f"friends. How many {item} does {name} have left?"
            )
            answer = total - friends * each
        out.append(Problem(q + " End your answer with the number only.", answer))
    return out


def grade_math(problem: Problem, content: str | None) -> bool:
    numbers = integers_in(content or "")
    return bool(numbers) and numbers[-1] == problem.answer


@dataclass
class MathScore:
    right: int
    total: int
    wrong: list[tuple[Problem, str | None]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.right / self.total if self.total else 0.0


def check_math(
    score: MathScore,
    expected: float,
    tolerance: float,
    server: str,
    baseline: float | None = None,
    *,
    api_only: bool = False,
) -> Finding:
    """Accuracy no more than ``tolerance`` below the profile's expected accuracy (vLLM's
    gsm8k eval: ``measured >= expected - 0.08``), nor below the baseline's."""
    floor = expected - tolerance
    if baseline is not None:
        floor = max(floor, baseline - tolerance)
    figure = f"{score.right}/{score.total} = {score.accuracy:.2f}"
    ref = f"expected {expected:.2f} - {tolerance}" + (
        f", baseline {baseline:.2f} - {tolerance}" if baseline is not None else ""
    )
    if score.accuracy + 1e-9 >= floor:
        return Finding.passed(
            round(score.accuracy, 3),
            round(floor, 3),
            "accuracy",
            message=f"{server}: math {figure} ({ref})",
        )
    shown = "\n".join(
        f"  - {p.question!r} -> {clip(a or '')!r}; expected {p.answer}" for p, a in score.wrong[:3]
    )
    return Finding.failed(
        round(score.accuracy, 3),
        round(floor, 3),
        "accuracy",
        message=(
            f"{server}: math accuracy {figure} is below {floor:.2f} ({ref}); e.g.\n{shown}\n"
            f"Likely layer: {advice('alone', api_only)}"
        ),
    )


def stderr_of(p: float, n: int) -> float:
    """The standard error of an accuracy ``p`` over ``n`` questions (to size a tolerance)."""
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else 0.0
