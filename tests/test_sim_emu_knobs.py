"""``spark-sim up --emu KNOB=VALUE``: an emulator knob for every `vllm serve` of a sim,
through the node's defaults.env, under the name the emulator reads."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from sparksim import cli, serving
from sparksim.emulator.config import Knobs
from sparksim.topology import build


def test_emu_knob_takes_the_emulators_numeric_knobs_only() -> None:
    assert cli._emu_knob("decode_tok_s=160") == ("decode_tok_s", "160")
    assert cli._emu_knob("ttft_s=0.10") == ("ttft_s", "0.1")
    for bad in ("decode_tok_s", "bogus=1", "decode_tok_s=fast", "time_scale=1", "fault=x"):
        with pytest.raises(argparse.ArgumentTypeError):
            cli._emu_knob(bad)


def test_up_parses_repeated_knobs() -> None:
    args = cli.build_parser().parse_args(["up", "--emu", "decode_tok_s=160", "--emu", "ttft_s=0.1"])
    assert dict(args.emu) == {"decode_tok_s": "160", "ttft_s": "0.1"}
    assert cli.build_parser().parse_args(["up"]).emu == []


def test_a_knob_reaches_the_emulator_through_defaults_env(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    topo = build(15, 2)
    head = topo.nodes[0]
    serving.install_node(state, topo, head, 0.002, {"decode_tok_s": "160", "ttft_s": "0.1"})
    text = (serving.home(state, head) / serving.SIM_ETC / serving.DEFAULTS_ENV).read_text()
    env = dict(line.split("=", 1) for line in text.splitlines())
    knobs = Knobs.from_env(env)
    assert (knobs.decode_tok_s, knobs.ttft_s, knobs.time_scale) == (160.0, 0.1, 0.002)
    serving.install_node(state, topo, head)  # without: the emulator's own defaults
    text = (serving.home(state, head) / serving.SIM_ETC / serving.DEFAULTS_ENV).read_text()
    assert Knobs.from_env(dict(line.split("=", 1) for line in text.splitlines())).decode_tok_s == 40
