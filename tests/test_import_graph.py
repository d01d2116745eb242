"""pytest_spark's arrows run one way: from the wiring down to the parsers and access.

The graph is built from the source (``ast``, every import: module level, inside functions
and under ``TYPE_CHECKING``), so nothing is imported. Three rules:

- no circle among pytest_spark's modules;
- an arrow from one part to another goes the way ``MAY_IMPORT`` allows (wiring ->
  readiness -> infra's gather -> check -> probe -> parse). ``infra/`` holds one folder per
  topic whose files are named by role (``parse.py``, ``probe.py``, ``gather.py``,
  ``check.py``, or ``<part>_<role>.py``), so there the part is the file's role
  (``infra.check``), not the folder;
- the pure roles (check, parse, probe) import no pytest.

The code keeps all three: ``KNOWN_CIRCLES`` and ``KNOWN_ARROWS`` (exceptions by name, each
failing once it is gone, so the lists only shrink) are empty since issue #14 §1.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_spark"
SPARKSIM = PACKAGE.parent / "sparksim"
WIRING = "wiring"  # pytest_spark/*.py: plugin, hooks, fixtures, state, __init__

# infra/: the roles a file may have, and the shared modules' roles (their names say what
# they hold, not a role). A package marker (``infra``, ``infra.links``) is part "infra".
ROLES = ("parse", "probe", "check", "gather")
SHARED_ROLES = {
    "errors": "parse",
    "probe": "probe",
    "finding": "check",  # Finding, CheckNote and Skip: what every check returns
    "roundtrip": "gather",
    "human": "parse",  # the human formats every message shares
    "serveargs": "parse",  # what a `vllm serve` command line asks for
    "servecmd": "probe",  # the serving command read from the node
    "kernellog": "probe",  # the kernel log read once, by current- and previous-boot checks
    "smi": "parse",  # nvidia-smi's query CSV
    "hostprobe": "probe",  # HostProbe: how a topic declares its probe of a node (pure)
    "modelfiles": "parse",  # the model directory's listing, by preflight and modelhash
}
PURE_ROLES = ("infra.parse", "infra.probe", "infra.check")  # no pytest, no access, no gather

# part -> the parts it may import (besides itself). The direction of issues #14 and #26.
MAY_IMPORT: dict[str, set[str]] = {
    WIRING: {
        "readiness",
        "launchers",  # fixtures catch launchers.base.NotServing (issue #37)
        "infra.gather",
        "serving",
        "measure",
        "report",
        "infra.check",
        "infra.probe",
        "infra.parse",
        "access",
        "settings",
    },
    "readiness": {
        "serving",
        "launchers",  # the launch calls a launcher plug-in through its interface (issue #37)
        "infra.gather",
        "infra.check",
        "infra.probe",
        "infra.parse",
        "access",
        "settings",
    },
    # launching as a plug-in (issue #37): launch-cluster.sh's -n list is each node's fabric
    # address (infra.links); the readiness watch above calls the launchers, never back
    "launchers": {"infra.gather", "infra.probe", "access", "settings"},
    "infra.gather": {
        "infra.check",
        "infra.probe",
        "infra.parse",
        "access",
        "settings",
    },
    # the report's live lines show the launch's progress (readiness.watch); nothing there
    # imports the report
    "report": {WIRING, "readiness", "infra.check", "infra.parse", "access", "settings"},
    "serving": {"measure", "infra.check", "infra.probe", "infra.parse", "access", "settings"},
    "measure": {"access", "settings"},
    "infra.check": {"infra.probe", "infra.parse", "settings"},
    "infra.probe": {"infra.parse", "settings"},
    "infra.parse": set(),
    "infra": set(),
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


def role_of(module: str) -> str | None:
    """The role of an infra module by its file name (``check``, ``gid_check``), the role of
    a shared one (``SHARED_ROLES``), or ``None`` (no role: not an infra file, or misnamed)."""
    name = module.rpartition(".")[2]
    if name in SHARED_ROLES and module.count(".") == 2:
        return SHARED_ROLES[name]
    role = name.rpartition("_")[2]
    return role if role in ROLES else None


def part_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or (PACKAGE / f"{parts[1]}.py").exists():
        return WIRING
    if parts[1] == "infra":
        if (PACKAGE.joinpath(*parts[1:]) / "__init__.py").exists():
            return "infra"
        role = role_of(module)
        return f"infra.{role}" if role else "infra (no role: name the file by its role)"
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


def test_at_most_eight_loose_modules() -> None:
    """The wiring: __init__, plugin (the entry point: options, the inert guard, the role
    chosen once), roles (the controller and worker plugin objects, imported once active),
    hooks, fixtures, state, suitedir and verdict (the check's verdict API the suite imports
    through the root)."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= 8, f"pytest_spark/ has {len(loose)} loose modules: {loose}"


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
        "imports against the direction wiring -> readiness -> infra's gather -> check -> probe "
        f"-> parse, and access (MAY_IMPORT): {new}"
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
    assert "pytest_spark.roles" in edges["pytest_spark.plugin"]
    assert "pytest_spark.fixtures" in edges["pytest_spark.roles"]
    assert "pytest_spark.infra.finding" in edges["pytest_spark.infra.links.check"]
    assert part_of("pytest_spark.infra.links.check") == "infra.check"
    assert part_of("pytest_spark.infra.nccl.gid_parse") == "infra.parse"
    assert part_of("pytest_spark.infra.roundtrip") == "infra.gather"
    assert part_of("pytest_spark.infra.links") == "infra"
    assert part_of("pytest_spark.infra.links.helpers").startswith("infra (no role")
    assert "pytest_spark.serving.client.stream" in edges["pytest_spark.serving.load.sweep"]
    assert serving_part("pytest_spark.serving.validate.tools") == "validate"
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]


# infra's topics stand alone (issue #37): a topic imports the shared infra modules
# (SHARED_ROLES), never another topic, except where one topic's check needs another's
# facts. Each such pair is listed with its reason; an entry fails once its arrow is gone,
# so the list only shrinks.
# BEGIN TOPIC ALLOW
TOPIC_ALLOWED: dict[tuple[str, str], str] = {
    ("memory", "preflight"): "the headroom check leaves the serving container's own "
    "processes out: the container comes from the preflight probe's docker facts",
    ("nccl", "links"): "NCCL runs over the fabric: which ports are up decides which HCAs "
    "the sweep may use, and a down link is cited rather than measured again",
    ("nccl", "memory"): "the sweep's largest message is capped by the node's free memory",
    ("preflight", "links"): "the serving-env check names this node's own fabric "
    "interfaces, read by the links probe",
}
# END TOPIC ALLOW


def topic_of(module: str) -> str | None:
    """``links`` for ``pytest_spark.infra.links.check``; None outside a topic folder."""
    parts = module.split(".")
    if len(parts) < 3 or parts[1] != "infra":
        return None
    return parts[2] if (PACKAGE / "infra" / parts[2] / "__init__.py").exists() else None


def topic_arrows(edges: dict[str, set[str]]) -> dict[tuple[str, str], set[str]]:
    """(topic, other topic) -> the imports behind that arrow."""
    found: dict[tuple[str, str], set[str]] = {}
    for src, targets in edges.items():
        for dst in targets:
            a, b = topic_of(src), topic_of(dst)
            if a and b and a != b:
                found.setdefault((a, b), set()).add(f"{src} -> {dst}")
    return found


def test_topics_stand_alone() -> None:
    """A topic imports shared infra modules (finding, human, kernellog, serveargs, ...),
    not another topic: a check is added by reading one folder."""
    found = topic_arrows(graph())
    new = {pair: sorted(how) for pair, how in found.items() if pair not in TOPIC_ALLOWED}
    assert not new, (
        f"infra topics importing one another: {new}; move the shared piece to a shared "
        "infra module (pytest_spark/infra/*.py), or list the pair in TOPIC_ALLOWED with why"
    )
    assert topic_of("pytest_spark.infra.links.check") == "links"
    assert topic_of("pytest_spark.infra.finding") is None


def test_topic_allow_list_only_shrinks() -> None:
    gone = sorted(set(TOPIC_ALLOWED) - set(topic_arrows(graph())))
    assert not gone, f"these topic arrows are gone: remove them from TOPIC_ALLOWED: {gone}"


def imports_pytest(path: Path) -> list[int]:
    """Lines of ``path`` that import pytest (or its private ``_pytest``)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(n.split(".")[0] in ("pytest", "_pytest") for n in names):
            lines.append(node.lineno)
    return lines


def test_pure_roles_import_no_pytest() -> None:
    """check, parse and probe files are pure: a pytest import (a skip, a fail) belongs in
    the gatherer or the suite."""
    bad = {
        name: imports_pytest(path)
        for name, path in modules().items()
        if part_of(name) in PURE_ROLES and imports_pytest(path)
    }
    assert not bad, f"pure infra modules (check, parse, probe) that import pytest: {bad}"


def test_pure_roles_see_pytest_imports(tmp_path: Path) -> None:
    """The rule above judges real imports: a file that imports pytest is seen."""
    (tmp_path / "check.py").write_text("def f():\n    from _pytest import outcomes\n")
    (tmp_path / "parse.py").write_text("import re\n")
    assert imports_pytest(tmp_path / "check.py") == [2]
    assert imports_pytest(tmp_path / "parse.py") == []
    assert "pytest" not in MAY_IMPORT["infra.check"]
    assert not {"access", "infra.gather"} & (
        MAY_IMPORT["infra.check"] | MAY_IMPORT["infra.probe"] | MAY_IMPORT["infra.parse"]
    )
