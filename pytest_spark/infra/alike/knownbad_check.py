"""Known-bad versions (issue #28 §2): no node runs a version the profile's ``[known_bad]``
deny list names, unless an allow entry of the same component matches it.

Pure, over the nodes-alike facts (:mod:`pytest_spark.infra.alike.probe`): the NVIDIA
driver and kernel release, the DGX OS release (``/etc/dgx-release``), the ConnectX-7
firmware (``ethtool -i``) and the NCCL library the serving image loads. One failure for
every denied version found (one cause), naming each node, the measured version, the rule,
its source, its scope where the source gives one, and the fix. A node whose value is not
readable is left out and said; the check that owns that fact fails for it.

:func:`denied_nodes` says which nodes a rule owns per component: the nodes-alike check
leaves those out of its comparison (a node on a known-bad driver differs from the others
too; that is one cause, and this check names it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pytest_spark.infra.alike.knownbad_parse import Value, parse_pattern
from pytest_spark.infra.alike.probe import Fact, NodeAlike
from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.finding import Finding
from pytest_spark.settings.sections import KnownBadSection, VersionRule

# What each component is called in a message.
COMPONENT_NAMES = {
    "driver": "NVIDIA driver",
    "kernel": "kernel release",
    "dgx-os": "DGX OS release",
    "cx7-firmware": "ConnectX-7 firmware",
    "nccl": "NCCL library",
}


def component_value(facts: NodeAlike, component: str) -> tuple[Value | None, str | None]:
    """(the node's value of ``component``, or None and why it was not read)."""
    if component == "nccl":
        if facts.container is None:
            return None, facts.container_error or facts.image_error or "serving image not read"
        lib = facts.container.nccl_loaded
        if lib is None:
            return None, "no libnccl in the serving image"
        build = f", Build ID {lib.build_id}" if lib.build_id else ""
        text = f"{lib.version or '?'} ({lib.path}, sha256 {lib.sha256}{build})"
        return Value(text, lib.sha256, lib.build_id), None
    fact: Fact = {
        "driver": facts.driver,
        "kernel": facts.kernel,
        "dgx-os": facts.dgx_os,
        "cx7-firmware": facts.cx7_firmware,
    }[component]
    if fact.value is None:
        return None, fact.why or "not read"
    return Value(fact.value), None


def rule_matches(rule: VersionRule, value: Value) -> bool:
    """Whether any of the rule's patterns matches (ParseError for a pattern that is none
    of the forms :mod:`pytest_spark.infra.alike.knownbad_parse` knows)."""
    return any(parse_pattern(spec).matches(value) for spec in rule.match)


@dataclass(frozen=True)
class Hit:
    node: str
    value: Value
    rule: VersionRule

    def describe(self) -> str:
        rule = self.rule
        what = COMPONENT_NAMES[rule.component]
        scope = f" (scope: {rule.scope})" if rule.scope else ""
        return (
            f"{self.node}: {what} {self.value.text} matches known-bad "
            f"{' or '.join(repr(m) for m in rule.match)}: {rule.reason or 'no reason given'}"
            f" [source: {rule.source or 'none given'}]{scope}"
        )


def find_hits(
    facts: Mapping[str, NodeAlike], known_bad: KnownBadSection
) -> tuple[list[Hit], list[str], list[str]]:
    """(deny hits not overridden by an allow entry, allowed notes, unreadable notes)."""
    hits: list[Hit] = []
    allowed: list[str] = []
    unread: list[str] = []
    components = dict.fromkeys(r.component for r in known_bad.deny if r.match)
    for component in components:
        for node, f in facts.items():
            value, why = component_value(f, component)
            if value is None:
                unread.append(f"{COMPONENT_NAMES[component]} not read on {node} ({why})")
                continue
            denied = [
                r for r in known_bad.deny if r.component == component and rule_matches(r, value)
            ]
            if not denied:
                continue
            allow = next(
                (r for r in known_bad.allow if r.component == component and rule_matches(r, value)),
                None,
            )
            if allow is not None:
                allowed.append(
                    f"{node}: {COMPONENT_NAMES[component]} {value.text} allowed by "
                    f"{' or '.join(repr(m) for m in allow.match)}"
                    + (f" ({allow.reason})" if allow.reason else "")
                )
                continue
            hits += [Hit(node, value, rule) for rule in denied]
    return hits, allowed, unread


def denied_nodes(facts: Mapping[str, NodeAlike], known_bad: KnownBadSection) -> dict[str, set[str]]:
    """``{component: nodes}`` whose value a deny entry matches (not allowed): the facts
    this check owns. A pattern that cannot be read owns nothing here (the check fails)."""
    try:
        hits = find_hits(facts, known_bad)[0]
    except ParseError:
        return {}
    out: dict[str, set[str]] = {}
    for hit in hits:
        out.setdefault(hit.rule.component, set()).add(hit.node)
    return out


def check_known_bad(facts: Mapping[str, NodeAlike], known_bad: KnownBadSection) -> Finding:
    """No node on a version the deny list names (see the module docstring)."""
    try:
        hits, allowed, unread = find_hits(facts, known_bad)
    except ParseError as exc:
        return Finding.failed(
            None,
            "match patterns a profile can hold",
            message=f"cannot read a [known_bad] entry of the profile: {exc}. Fix: correct "
            "its match list ('590.', '>=590 <591', 're:REGEX', 'sha256:HEX', 'build-id:HEX')",
        )
    rules = [r for r in known_bad.deny if r.match]
    measured = {
        node: {
            COMPONENT_NAMES[c]: (v.text if v else None)
            for c in dict.fromkeys(r.component for r in rules)
            for v in [component_value(f, c)[0]]
        }
        for node, f in facts.items()
    }
    expected = "none of: " + "; ".join(
        f"{COMPONENT_NAMES[r.component]} {' or '.join(r.match)}" for r in rules
    )
    notes = [*allowed, *unread]
    note = f" ({'; '.join(notes)})" if notes else ""
    if hits:
        nodes = sorted({h.node for h in hits})
        fixes = dict.fromkeys(h.rule.fix for h in hits if h.rule.fix)
        return Finding.failed(
            measured,
            expected,
            node=nodes[0] if len(nodes) == 1 else None,
            message=(
                f"known-bad version on {', '.join(nodes)}: "
                f"{'; '.join(h.describe() for h in hits)}{note}. "
                f"Fix: {'; '.join(fixes) or 'move off the version the rule names'}"
            ),
        )
    waiting = [r for r in known_bad.deny if not r.match]
    waits = (
        f"; {len(waiting)} entr{'y' if len(waiting) == 1 else 'ies'} with no match yet "
        f"({', '.join(COMPONENT_NAMES[r.component] for r in waiting)}: add the evidence)"
        if waiting
        else ""
    )
    return Finding.passed(
        measured,
        expected,
        message=f"{len(facts)} node(s) on no known-bad version "
        f"({len(rules)} rule(s) checked{waits}){note}",
    )
