"""ACKER_SHARD_INDEX_FROM_HOSTNAME: a StatefulSet pod's ordinal becomes the shard index, and nonsense is refused."""

from __future__ import annotations

import socket

import pytest

from acker_service.cli import build_parser, config_from_args
from acker_service.shard_identity import ShardIdentityError, environ_with_shard_index, ordinal_of


@pytest.mark.parametrize(
    ("hostname", "ordinal"),
    [("acker-0", 0), ("acker-2", 2), ("pyspark-acker-17", 17), ("acker-1.ackers.default.svc.cluster.local", 1)],
)
def test_ordinal_of_statefulset_pod_names(hostname: str, ordinal: int) -> None:
    """The number after the last dash of the pod name (the first DNS label) is the ordinal."""
    assert ordinal_of(hostname) == ordinal


@pytest.mark.parametrize("hostname", ["acker", "acker-", "acker-01", "acker-x", "4f1c2b9e0a7d", "-3"])
def test_names_without_an_ordinal_are_refused(hostname: str) -> None:
    """A host name that is not `<name>-<ordinal>` is an error naming the alternative, not shard 0."""
    with pytest.raises(ShardIdentityError, match="ACKER_SHARD_INDEX"):
        ordinal_of(hostname)


def test_option_off_leaves_the_environment_alone() -> None:
    """Without the option (or with 0) the host name is not even read."""

    def no_hostname() -> str:
        raise AssertionError("the host name must not be read")

    for env in ({}, {"ACKER_SHARD_INDEX_FROM_HOSTNAME": "0", "ACKER_SHARD_INDEX": "5"}):
        assert environ_with_shard_index(env, no_hostname) == env


def test_option_on_sets_the_shard_index() -> None:
    """With the option on, ACKER_SHARD_INDEX comes from the host name; an agreeing explicit value is fine."""
    env = environ_with_shard_index({"ACKER_SHARD_INDEX_FROM_HOSTNAME": "1"}, lambda: "acker-2")
    assert env["ACKER_SHARD_INDEX"] == "2"
    same = {"ACKER_SHARD_INDEX_FROM_HOSTNAME": "true", "ACKER_SHARD_INDEX": "2"}
    assert environ_with_shard_index(same, lambda: "acker-2")["ACKER_SHARD_INDEX"] == "2"


def test_contradiction_and_bad_values_are_refused() -> None:
    """An explicit index that disagrees with the ordinal, or a value that is not a boolean, is an error."""
    with pytest.raises(ShardIdentityError, match="contradicts"):
        environ_with_shard_index({"ACKER_SHARD_INDEX_FROM_HOSTNAME": "1", "ACKER_SHARD_INDEX": "0"}, lambda: "acker-1")
    with pytest.raises(ShardIdentityError, match="use 1 or 0"):
        environ_with_shard_index({"ACKER_SHARD_INDEX_FROM_HOSTNAME": "maybe"}, lambda: "acker-1")


def test_acker_server_takes_its_shard_from_the_pod_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """acker-server's parser: pod acker-2 of a 3-replica StatefulSet is shard 2 of 3."""
    monkeypatch.setattr(socket, "gethostname", lambda: "acker-2")
    env = {"ACKER_SHARD_INDEX_FROM_HOSTNAME": "1", "ACKER_SHARD_COUNT": "3"}
    config = config_from_args(build_parser(env).parse_args([]))
    assert (config.shard_index, config.shard_count) == (2, 3)


def test_acker_server_refuses_a_pod_name_without_ordinal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host name without an ordinal stops acker-server with exit status 2 and the reason."""
    monkeypatch.setattr(socket, "gethostname", lambda: "acker-deployment-7c9f")
    with pytest.raises(SystemExit) as exc:
        build_parser({"ACKER_SHARD_INDEX_FROM_HOSTNAME": "1"})
    assert exc.value.code == 2
    assert "does not end in '-<ordinal>'" in capsys.readouterr().err
