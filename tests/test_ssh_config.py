"""ssh_config resolution: aliases, HostName, User, IdentityFile, Port, ProxyJump,
UserKnownHostsFile; explicit options win like ssh -l / -i."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_spark.access.ssh import _split_host, resolve_target

CONFIG = """
Host head
    HostName 198.18.5.11
    User aurora
    Port 2222
    IdentityFile ~/.ssh/spark_ed25519
    UserKnownHostsFile /etc/spark/known_hosts /tmp/other_known_hosts
    IdentitiesOnly yes

Host worker1
    HostName 198.18.5.12
    ProxyJump head

Host 198.18.6.*
    User root
"""


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    path = tmp_path / "config"
    path.write_text(CONFIG)
    return path


def test_alias_resolves_every_field(cfg: Path) -> None:
    t = resolve_target("head", ssh_config=cfg)
    assert (t.hostname, t.port, t.user) == ("198.18.5.11", 2222, "aurora")
    assert t.identity_files == (str(Path("~/.ssh/spark_ed25519").expanduser()),)
    assert t.known_hosts == ("/etc/spark/known_hosts", "/tmp/other_known_hosts")
    assert t.identities_only is True
    assert t.proxy_jump is None
    assert t.describe() == "head (198.18.5.11:2222)"


def test_proxyjump_and_defaults(cfg: Path) -> None:
    t = resolve_target("worker1", ssh_config=cfg)
    assert t.hostname == "198.18.5.12"
    assert t.proxy_jump == "head"
    assert t.port == 22
    assert t.known_hosts == (str(Path("~/.ssh/known_hosts").expanduser()),)


def test_wildcard_host_block(cfg: Path) -> None:
    assert resolve_target("198.18.6.20", ssh_config=cfg).user == "root"


def test_explicit_user_and_key_win_over_config(cfg: Path, tmp_path: Path) -> None:
    key = tmp_path / "k"
    t = resolve_target("head", ssh_config=cfg, user="ops", identity=key)
    assert t.user == "ops"
    assert t.identity_files == (str(key),)


def test_user_at_host_port_spec(cfg: Path) -> None:
    t = resolve_target("ops@198.18.7.1:2200", ssh_config=cfg)
    assert (t.user, t.hostname, t.port) == ("ops", "198.18.7.1", 2200)


def test_missing_config_file_is_not_an_error(tmp_path: Path) -> None:
    t = resolve_target("198.18.9.9", ssh_config=tmp_path / "absent")
    assert t.hostname == "198.18.9.9"


@pytest.mark.parametrize(
    ("spec", "parts"),
    [
        ("h", (None, "h", None)),
        ("u@h", ("u", "h", None)),
        ("u@h:2", ("u", "h", 2)),
        ("[fe80::1]:22", (None, "fe80::1", 22)),
    ],
)
def test_split_host(spec: str, parts: tuple[str | None, str, int | None]) -> None:
    assert _split_host(spec) == parts


def test_paramiko_logger_is_kept_quiet_unless_the_user_set_it() -> None:
    """paramiko's transport thread logs dropped sockets and tracebacks at ERROR; with no
    handler they reach the terminal. The suite reports those failures itself (issue #25 §5)."""
    import logging

    from pytest_spark.access.ssh import SSHConnection, SSHTarget

    logger = logging.getLogger("paramiko")
    before = logger.level
    try:
        logger.setLevel(logging.NOTSET)
        SSHConnection("spark-head", SSHTarget("head", "192.0.2.1"))
        assert logger.level == logging.CRITICAL
        logger.setLevel(logging.DEBUG)  # the user's own choice
        SSHConnection("spark-head", SSHTarget("head", "192.0.2.1"))
        assert logger.level == logging.DEBUG
    finally:
        logger.setLevel(before)
