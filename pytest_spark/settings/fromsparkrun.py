"""What sparkrun already knows, put into the settings (resolve.resolve calls these two):

- ``apply_cluster``: ``--spark-cluster=NAME`` gives the head, the workers and the user of
  the saved cluster; an explicit ``--spark-head`` / ``--spark-workers`` that names other
  nodes is a conflict, not a silent winner; an explicit ``--spark-user`` wins.
- ``apply_recipe``: ``--spark-recipe=PATH``, or the file of the sparkrun job running on
  the nodes, sets what is expected: the served name and port (when not given), the nodes
  that serve (TP x PP), and the profile's tool-call and reasoning expectations; the job's
  overrides are applied. Where the recipe and the profile disagree, the recipe (what runs)
  is taken and ``SparkRecipe.notes`` says so for the session header.

Each value set here names its source (``sparkrun cluster mylab``, ``recipe /path/x.yaml``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from pytest_spark.settings.profiles import Profile, ProfileError
from pytest_spark.settings.sparkrun import (
    SparkRecipe,
    SparkrunError,
    SparkrunJob,
    find_job,
    read_cluster,
    read_jobs,
)

SettingsError = pytest.UsageError


def _given(sources: Mapping[str, str], attr: str) -> bool:
    return sources[attr] != "default"


def apply_cluster(values: dict[str, Any], sources: dict[str, str], env: Mapping[str, str]) -> None:
    """Head, workers and user from ``--spark-cluster`` (nothing when it is not given)."""
    name = values["cluster"]
    if name is None:
        return
    try:
        cluster = read_cluster(name, env)
    except SparkrunError as exc:
        raise SettingsError(f"{exc} (from {sources['cluster']})") from None
    source = f"sparkrun cluster {cluster.name}"
    for attr, theirs in (("head", cluster.head), ("workers", cluster.workers)):
        if _given(sources, attr) and values[attr] != theirs:
            shown = ",".join(theirs) if isinstance(theirs, tuple) else theirs
            mine = ",".join(values[attr]) if isinstance(values[attr], tuple) else values[attr]
            raise SettingsError(
                f"--spark-{attr} {mine or '(none)'} (from {sources[attr]}) and "
                f"--spark-cluster {cluster.name} (from {sources['cluster']}, {cluster.path}: "
                f"{attr} {shown or '(none)'}) name different nodes: give one of them "
                "(--spark-cluster alone takes the saved cluster's hosts, the first the head)"
            )
        values[attr], sources[attr] = theirs, source
    if cluster.user is not None and not _given(sources, "user"):
        values["user"], sources["user"] = cluster.user, source
    values["cluster"] = cluster.name  # the default cluster by its name


def _job(values: Mapping[str, Any], env: Mapping[str, str]) -> SparkrunJob | None:
    """The sparkrun job running on the given nodes, when attaching to them (not with
    --spark-sim or --spark-launch, which start their own): the one --spark-job names
    (its cluster id), else the newest on these nodes."""
    if values["head"] is None or values["sim"] or values["launch"]:
        return None
    named = values.get("job")
    if named:
        return next((j for j in read_jobs(env) if j.cluster_id == named), None)
    return find_job((values["head"], *values["workers"]), env)


def _with_job(recipe: SparkRecipe | None, job: SparkrunJob | None) -> SparkRecipe | None:
    """The recipe the job's overrides apply to: the given one when the job runs its model
    (else a note says the job's are not applied), or the job's own recipe state."""
    if job is None:
        return recipe
    if recipe is None:
        try:
            return job.recipe()
        except SparkrunError:
            return None
    if job.model is None or job.model == recipe.model:
        if not job.overrides:
            return recipe
        shown = ", ".join(f"{k}={v}" for k, v in job.overrides.items())
        return recipe.with_overrides(
            job.overrides, f"{recipe.origin} with sparkrun job {job.cluster_id}'s -o {shown}"
        )
    note = (
        f"sparkrun job {job.cluster_id} on these nodes serves {job.model}, not the recipe's "
        f"{recipe.model}: its overrides are not applied ({job.path})"
    )
    return replace(recipe, notes=(*recipe.notes, note))


def _serving_nodes(
    recipe: SparkRecipe,
    job: SparkrunJob | None,
    values: dict[str, Any],
    sources: dict[str, str],
) -> list[str]:
    """Head and workers cut to the recipe's TP x PP nodes, as sparkrun places them (the
    job's own hosts when one runs, else the first nodes of a saved cluster); an error when
    fewer are given, or more typed by hand. Returns the header's note when it cuts."""
    if values["head"] is None:
        return []
    nodes = (values["head"], *values["workers"])
    need = recipe.nodes
    how = f"TP {recipe.tensor_parallel} x PP {recipe.pipeline_parallel} = {need} node"
    how += "s" if need != 1 else ""
    if need == len(nodes):
        return []
    where = sources["workers"] if values["workers"] else sources["head"]
    if need > len(nodes):
        raise SettingsError(
            f"{recipe.origin} serves on {how}; {len(nodes)} given ({', '.join(nodes)}, from "
            f"{where}): give every node that serves (--spark-workers), or the recipe the job "
            "was started with"
        )
    if job is not None and len(job.hosts) == need:
        used = job.hosts
    elif where.startswith("sparkrun cluster"):
        used = nodes[:need]
    else:
        raise SettingsError(
            f"{recipe.origin} serves on {how}; {len(nodes)} given ({', '.join(nodes)}, from "
            f"{where}): give the {need} that serve, the head first"
        )
    values["head"], values["workers"] = used[0], tuple(used[1:])
    for attr in ("head", "workers"):
        sources[attr] = f"{sources[attr]}, cut to {recipe.origin}'s {need}"
    note = (
        f"{recipe.origin} serves on {how}: checking {', '.join(used)} of {where}'s "
        f"{len(nodes)} nodes, as sparkrun places it"
    )
    return [note]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _expectations(
    recipe: SparkRecipe, profile: Profile, threshold: Mapping[str, str]
) -> tuple[Profile, tuple[str, ...], list[str]]:
    """The profile with the recipe's tool-call and reasoning expectations (keys set by
    --spark-threshold keep theirs), the keys it set, and a note where the two disagree."""
    changed: dict[str, str] = {}
    disagree: list[str] = []
    for key, (want, why) in recipe.expected_capabilities().items():
        if key in threshold:
            continue
        changed[key] = "true" if want else "false"
        have = bool(profile.value(key))
        if have != want:
            disagree.append(f"{key} {_yes(want)} ({why}; profile {profile.name}: {_yes(have)})")
    try:
        updated = profile.with_overrides(changed) if changed else profile
    except ProfileError as exc:  # a key the profile schema lost: a bug here, said plainly
        raise SettingsError(f"{recipe.origin}: {exc}") from None
    notes = []
    if disagree:
        notes.append(
            f"{recipe.origin} and profile {profile.name} disagree: {'; '.join(disagree)}. "
            "The recipe is what runs, so its word is taken (--spark-threshold=KEY=VALUE "
            "sets one)"
        )
    return updated, tuple(changed), notes


def apply_recipe(values: dict[str, Any], sources: dict[str, str], env: Mapping[str, str]) -> None:
    """Expectations from ``--spark-recipe`` or the running job's file (after the profile
    and its --spark-threshold overrides are in ``values``)."""
    job = _job(values, env)
    given: SparkRecipe | None = values["recipe"]
    recipe = _with_job(given, job)
    if recipe is None:
        return
    if given is None and job is not None:
        sources["recipe"] = f"sparkrun job {job.cluster_id} ({job.path})"
    notes = [*recipe.notes, *_serving_nodes(recipe, job, values, sources)]
    if not _given(sources, "model"):
        values["model"], sources["model"] = recipe.served_model_name, recipe.origin
    if not _given(sources, "port"):
        values["port"], sources["port"] = recipe.port, recipe.origin
    profile, keys, more = _expectations(recipe, values["profile"], values["threshold"])
    values["profile"] = profile
    notes += more
    values["recipe"] = replace(recipe, notes=tuple(notes), profile_keys=keys)
