"""An old owner restarted after its cut: running the move again is refused, and acker-ctl says so truthfully.

An acker restarted after a cut of a move does not rejoin it (docs/acker-semantics.md,
"Moving trees"): its new, empty handoffs reach new owners that merged all of
its chunks already, and they refuse them. That refusal is an answer: the cut
reports FAILED_PRECONDITION naming the refusing acker and why, not UNAVAILABLE
"could not reach their new owners", which sent operators looking for a network
fault that was not there.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from acker_client import ClusterClient
from acker_client.testing import unreachable_addresses
from acker_ctl.cluster import Cluster, CtlError
from acker_ctl.reshard import reshard

from acker_service.config import ServerConfig
from acker_service.handoff import MovedEntries
from acker_service.moving.layout import Layout
from acker_service.moving.reshard import Chunk, send_handoffs
from acker_service.server import AckerServer

from .workload import Trees

TIMEOUT = 30.0  # no tree times out during the test


def _server(index: int, count: int, port: int = 0) -> AckerServer:
    config = ServerConfig(
        host="127.0.0.1", port=port, grace=0.5, shard_index=index, shard_count=count, message_timeout=TIMEOUT
    )
    server = AckerServer(config)
    server.start()
    return server


def test_a_move_run_again_after_an_old_owner_restarted_past_its_cut_names_the_refusal(monkeypatch) -> None:
    old = [_server(0, 2), _server(1, 2)]
    newcomer = _server(2, 3)
    started = [*old, newcomer]
    two = [s.address for s in old]
    three = [*two, newcomer.address]
    client = ClusterClient(two, flush_interval=0.001)
    try:
        Trees(client).start(200)  # some of them move to the newcomer
        client.flush()
        real_call = Cluster._call

        def controller_dies_before_commit(self, shard, method, fn):
            if method == "CommitLayout":
                raise CtlError("the controller died here")
            return real_call(self, shard, method, fn)

        monkeypatch.setattr(Cluster, "_call", controller_dies_before_commit)
        with pytest.raises(CtlError, match="died here"):
            reshard(two, three, None)  # every acker prepared and cut: the newcomer merged shard 0's chunks
        monkeypatch.setattr(Cluster, "_call", real_call)

        port = int(old[0].address.rsplit(":", 1)[1])
        old[0].stop(0)
        old[0] = _server(0, 2, port)  # kill and restart of the old owner: back in its flags' layout
        started.append(old[0])

        with pytest.raises(CtlError) as refused:
            reshard(two, three, None)
        message = str(refused.value)
        assert "CutLayout failed: FAILED_PRECONDITION" in message, message
        assert "refused by their new owners" in message and newcomer.address in message, message
        assert "merged already" in message, message  # the new owners's own reason, passed on
        assert "could not reach" not in message, message
    finally:
        client.close()
        for server in started:
            server.stop(0)


def test_a_chunk_keeps_why_it_was_refused_and_an_unreachable_owner_gives_no_reason() -> None:
    """The classification the cut's error rests on, against a real acker that refuses and an address with no acker."""
    unprepared = _server(1, 2)  # not prepared for epoch 1: it refuses moved entries
    try:
        nowhere = unreachable_addresses(1)[0]
        chunk = Chunk(shard=0, key=7, entries=MovedEntries(), source=0, count=1)
        refused = asyncio.run(send_handoffs([chunk], Layout(1, 2, 0, (unprepared.address, nowhere))))
        unreached = asyncio.run(
            send_handoffs([replace(chunk, shard=1)], Layout(1, 2, 0, (unprepared.address, nowhere)))
        )
        assert [c.refusal for c in refused] == [refused[0].refusal] and refused[0].refusal.startswith(
            "FAILED_PRECONDITION: this acker is not prepared for layout epoch 1"
        ), refused
        assert [c.refusal for c in unreached] == [""], unreached  # not reached: no answer to pass on
    finally:
        unprepared.stop(0)
