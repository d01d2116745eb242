"""pytest_spark's arrows run one way: from the wiring down to parsers and access.

The graph is built from the source (``ast``, every import: module level, inside functions
and under ``TYPE_CHECKING``), so nothing is imported. Two rules:

- no circle among pytest_spark's modules;
- an arrow from one part to another goes the way ``MAY_IMPORT`` allows
  (wiring -> readiness and gathering -> checks and facts -> parsers and access).

The code keeps both: ``KNOWN_CIRCLES`` and ``KNOWN_ARROWS`` (exceptions by name, each
failing once it is gone, so the lists only shrink) are empty since issue #14 §1.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_spark"
SPARKSIM = PACKAGE.parent / "sparksim"
WIRING = "wiring"  # pytest_spark/*.py: plugin, hooks, fixtures, state, __init__

# part -> the parts it may import (besides itself). The direction of issue #14.
MAY_IMPORT: dict[str, set[str]] = {
    WIRING: {
        "readiness",
        "gathering",
        "collective",
        "serving",
        "report",
        "checks",
        "facts",
        "parsers",
        "access",
        "settings",
    },
    "readiness": {"serving", "gathering", "checks", "facts", "parsers", "access", "settings"},
    "gathering": {"collective", "checks", "facts", "parsers", "access", "settings"},
    "collective": {"checks", "facts", "parsers", "access", "settings"},
    # the report's live lines show the launch's progress (readiness.watch); nothing there
    # imports the report
    "report": {WIRING, "readiness", "checks", "parsers", "access", "settings"},
    "serving": {"checks", "facts", "parsers", "access", "settings"},
    "checks": {"facts", "parsers", "settings"},
    "facts": {"parsers", "access", "settings"},
    "parsers": set(),
    "access": {"settings"},
    "settings": set(),
}

# Inside serving, the three parts run one way too: validate -> load -> client. The package's
# own __init__ (the public surface) may import all three.
SERVING_MAY_IMPORT: dict[str, set[str]] = {
    "client": set(),
    "load": {"client"},
    "validate": {"client", "load"},
}

# Known exceptions, each named: none left (the last went with issue #14 §1). A new circle or
# arrow fails; fix the code (move the type or function down to its owner), do not list it.
# BEGIN KNOWN
KNOWN_CIRCLES: dict[str, frozenset[str]] = {}
KNOWN_ARROWS: dict[tuple[str, str], str] = {}
# END KNOWN


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def part_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or (PACKAGE / f"{parts[1]}.py").exists():
        return WIRING
    return parts[1]


def imports_of(name: str, path: Path, known: set[str]) -> Iterator[str]:
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [
                f"{module}.{a.name}" if f"{module}.{a.name}" in known else module
                for a in node.names
            ]
        else:
            continue
        for target in targets:
            # `import a.b.c` names the deepest module of the package that exists
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    mods = modules(package)
    known = set(mods)
    return {name: set(imports_of(name, path, known)) for name, path in mods.items()}


def circles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def wrong_arrows(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    bad = set()
    for src, targets in edges.items():
        for dst in targets:
            a, b = part_of(src), part_of(dst)
            if a != b and b not in MAY_IMPORT[a]:
                bad.add((src, dst))
    return bad


def test_every_module_is_in_a_part() -> None:
    unknown = {m: part_of(m) for m in modules() if part_of(m) not in MAY_IMPORT}
    assert not unknown, (
        f"modules in no part of MAY_IMPORT: {unknown}; add the folder to MAY_IMPORT with the "
        "parts it may import"
    )


def test_at_most_seven_loose_modules() -> None:
    """The wiring: __init__, plugin, hooks, fixtures, state, suitedir and verdict (the
    check's verdict API the suite imports through the root)."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= 7, f"pytest_spark/ has {len(loose)} loose modules: {loose}"


def test_no_new_circle() -> None:
    found = circles(graph())
    known = set(KNOWN_CIRCLES.values())
    new = [sorted(c) for c in found if c not in known]
    assert not new, (
        f"import circles among pytest_spark's modules: {new}; break each (move the type or "
        "function to the module that owns it, or import it where it is used)"
    )


def test_no_circle_in_sparksim() -> None:
    """The simulator keeps the rule too (issue #26 broke node -> serving -> faults -> node,
    hidden by a function-level import, and emulator engine <-> raystatus)."""
    edges = graph(SPARKSIM)
    assert "sparksim.faults.common" in edges["sparksim.cluster"]  # the graph sees imports
    found = [sorted(c) for c in circles(edges)]
    assert not found, f"import circles among sparksim's modules: {found}"


def test_known_circles_still_exist() -> None:
    found = set(circles(graph()))
    gone = [name for name, c in KNOWN_CIRCLES.items() if c not in found]
    assert not gone, f"these circles are gone or changed: remove them from KNOWN_CIRCLES: {gone}"


def test_arrows_run_one_way() -> None:
    bad = wrong_arrows(graph())
    new = sorted(bad - set(KNOWN_ARROWS))
    assert not new, (
        "imports against the direction wiring -> readiness and gathering -> checks and facts "
        f"-> parsers and access (MAY_IMPORT): {new}"
    )


def serving_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "serving" else None


def test_serving_parts_run_one_way() -> None:
    bad = sorted(
        (src, dst)
        for src, targets in graph().items()
        for dst in targets
        if (a := serving_part(src)) is not None
        and (b := serving_part(dst)) is not None
        and a != b
        and b not in SERVING_MAY_IMPORT[a]
    )
    assert not bad, f"serving imports against validate -> load -> client: {bad}"


def test_serving_modules_sit_in_a_part() -> None:
    loose = sorted(
        m
        for m in modules()
        if m.startswith("pytest_spark.serving.") and serving_part(m) not in SERVING_MAY_IMPORT
    )
    assert loose == [
        "pytest_spark.serving.client",
        "pytest_spark.serving.load",
        "pytest_spark.serving.validate",
    ], f"serving modules outside client, load and validate: {loose}"


def test_known_arrows_still_exist() -> None:
    gone = sorted(set(KNOWN_ARROWS) - wrong_arrows(graph()))
    assert not gone, f"these arrows are gone: remove them from KNOWN_ARROWS: {gone}"


def test_the_graph_sees_imports() -> None:
    """The rules judge a real graph: the plugin's own imports are in it."""
    edges = graph()
    assert "pytest_spark.fixtures" in edges["pytest_spark.plugin"]
    assert "pytest_spark.checks.base" in edges["pytest_spark.checks.links"]
    assert "pytest_spark.serving.client.stream" in edges["pytest_spark.serving.load.sweep"]
    assert serving_part("pytest_spark.serving.validate.tools") == "validate"
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]
