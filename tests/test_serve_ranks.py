"""How many ranks the serve args promise (TP x PP x DP) and what ``ray status`` must then
show across N nodes (infra.serveargs.expected_ray_members)."""

from __future__ import annotations

import pytest

from pytest_spark.infra.serveargs import expected_ray_members, parse_serve_args

pytestmark = pytest.mark.unit

MODEL = "vllm serve /models/Qwen3.5-122B-A10B-FP8 --max-model-len 32768"


@pytest.mark.parametrize(
    ("flags", "ranks", "nodes", "words"),
    [
        ("--tensor-parallel-size 2", 2, 2, "TP 2 x PP 1 = 2 ranks"),
        ("--tensor-parallel-size 2 --pipeline-parallel-size 2", 4, 4, "TP 2 x PP 2 = 4 ranks"),
        ("-tp 4 -pp 2", 8, 8, "TP 4 x PP 2 = 8 ranks"),
        ("--tensor-parallel-size=2 --data-parallel-size=2", 4, 4, "TP 2 x PP 1 x DP 2 = 4 ranks"),
        ("--pipeline-parallel-size 1", 1, 1, "TP 1 x PP 1 = 1 rank"),
    ],
)
def test_ranks_and_nodes_from_the_serve_args(
    flags: str, ranks: int, nodes: int, words: str
) -> None:
    args = parse_serve_args(f"{MODEL} {flags}")
    assert args.parallelism_given
    assert args.ranks == ranks and args.nodes_used() == nodes
    assert args.describe_ranks() == words


def test_ray_expects_tp_x_pp_ranks_on_the_nodes_the_launcher_keeps() -> None:
    # 8 Sparks behind a switch, TP 2 x PP 2: the launcher keeps 4 of them.
    line = f"{MODEL} --tensor-parallel-size 2 --pipeline-parallel-size 2"
    assert expected_ray_members(line, 8, 2.0) == (
        4,
        4.0,
        "the serve args' TP 2 x PP 2 = 4 ranks",
    )
    # TP 4 x PP 2 over 4 nodes: capped at the nodes there are (the launcher refuses it).
    assert expected_ray_members(f"{MODEL} -tp 4 -pp 2", 4, None)[:2] == (4, 8.0)


def test_without_parallelism_flags_ray_runs_on_every_node() -> None:
    # launch-cluster.sh trims nothing then: the profile's figure, else one GPU a node.
    assert expected_ray_members(MODEL, 2, 2.0) == (2, 2.0, "the profile's readiness.expected_gpus")
    assert expected_ray_members(None, 4, None) == (4, 4.0, "one GPU on each of the 4 nodes")
    assert not parse_serve_args(MODEL).parallelism_given
