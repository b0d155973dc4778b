"""The client's ApplyStream against real servers: one stream per shard, retries, refusals, replicas, old ackers."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
import numpy as np
import pytest
from acker_client import ClusterClient, new_id
from acker_client.errors import RequestRefused
from acker_protocol.v1 import acker_pb2

from acker_service.config import ServerConfig
from acker_service.server import AckerServer

from .polling import wait_until


def _calls(server: AckerServer, method: str) -> float:
    """How many calls of ``method`` the acker started (its grpc_server_started metric)."""
    kind = "BIDI_STREAM" if method == "ApplyStream" else "UNARY"
    labels = {"grpc_type": kind, "grpc_service": "acker_service.v1.Acker", "grpc_method": method}
    return server.metrics.sample("grpc_server_started_total", labels) or 0.0


def _pending(server: AckerServer) -> set[int]:
    return set(server.call(lambda: server.ledger.pending_roots()))


def test_batches_go_over_one_stream_per_shard(make_ackers, make_client):
    """Many batches to two shards: each acker sees one ApplyStream and no Apply call, and applies every init."""
    servers = make_ackers(2, message_timeout=60.0)
    client = make_client([s.address for s in servers])
    roots = [new_id() for _ in range(200)]
    for i, root in enumerate(roots):
        client.init(root, 1, "streamed")
        if i % 20 == 0:
            client.flush()
    client.flush()
    assert [_calls(s, "ApplyStream") for s in servers] == [1, 1]
    assert [_calls(s, "Apply") for s in servers] == [0, 0]
    assert _pending(servers[0]) | _pending(servers[1]) == set(roots)
    assert client.stats.batches_failed == 0


def test_a_restarted_acker_gets_the_batches_on_a_new_stream(make_ackers, make_client):
    """The acker restarts under an open stream: the batch sent meanwhile is retried and lands on the new acker."""
    (first,) = make_ackers(1, message_timeout=60.0)
    client = make_client([first.address], wait_for_shard=20.0, deadline=5.0)
    client.init(new_id(), 1, "restart")
    client.flush()
    port = first.config.port if first.config.port else first.port
    first.stop(0)
    root = new_id()
    client.init(root, 1, "restart")
    restarted: list[AckerServer] = []
    starter = threading.Thread(
        target=lambda: restarted.append(
            AckerServer(ServerConfig(host="127.0.0.1", port=port, grace=0.5, message_timeout=60.0)).start()
        )
    )
    starter.start()
    try:
        client.flush()  # waits for the acker to be back (wait_for_ready), then applies on a new stream
        starter.join()
        (second,) = restarted
        assert _pending(second) == {root}
        assert _calls(second, "ApplyStream") == 1
    finally:
        starter.join()
        for server in restarted:
            server.stop(0)


def test_a_refused_batch_is_refused_and_the_same_stream_serves_the_next(make_ackers, make_client):
    """A batch over the acker's --max-batch is RequestRefused with its message; the next batch uses the same stream."""
    (server,) = make_ackers(1, message_timeout=60.0, max_batch=4)
    client = make_client([server.address], verify=False)  # unverified: it does not know the acker's limit
    # One call buffers all ten at once: init() one by one could go out in small batches (an idle
    # shard is sent to at once), each under the limit.
    roots = np.array([new_id() for _ in range(10)], dtype=np.uint64)
    client.init_columns(roots, np.ones(10, dtype=np.uint64), "refused")
    with pytest.raises(RequestRefused) as caught:
        client.flush()
    assert caught.value.failures[0].code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max" in caught.value.failures[0].detail.lower()
    root = new_id()
    client.init(root, 1, "refused")
    client.flush()
    assert _pending(server) == {root}
    assert _calls(server, "ApplyStream") == 1


def test_with_replicas_each_replica_gets_its_own_stream(make_ackers, make_client):
    """--replicas 2: every init reaches both shards that keep its tree, each over that shard's own stream."""
    servers = make_ackers(3, message_timeout=60.0, replicas=2)
    client = make_client([s.address for s in servers])
    roots = [new_id() for _ in range(60)]
    for root in roots:
        client.init(root, 1, "replicated")
    client.flush()
    for root in roots:
        holders = {i for i, s in enumerate(servers) if root in _pending(s)}
        assert holders == {root % 3, (root + 1) % 3}
    assert [_calls(s, "ApplyStream") for s in servers] == [1, 1, 1]


class _OldAcker:
    """A gRPC server with Apply and Describe only (an acker from before ApplyStream); counts what it gets.

    With ``stream_answers`` it serves ApplyStream too, answering only on the calls the list says
    (True: ack every request; False: swallow them), to make an ack overdue.
    """

    def __init__(self, stream_answers: list[bool] | None = None) -> None:
        self.applied: list[int] = []
        self.streams = 0
        self._answers = stream_answers
        self._server = grpc.server(futures.ThreadPoolExecutor(4))
        handlers = {
            "Apply": grpc.unary_unary_rpc_method_handler(
                self._apply,
                request_deserializer=acker_pb2.ApplyRequest.FromString,
                response_serializer=acker_pb2.ApplyResponse.SerializeToString,
            ),
            "Describe": grpc.unary_unary_rpc_method_handler(
                lambda request, context: acker_pb2.DescribeResponse(shard_index=0, shard_count=1, max_batch=65536),
                request_deserializer=acker_pb2.DescribeRequest.FromString,
                response_serializer=acker_pb2.DescribeResponse.SerializeToString,
            ),
        }
        if stream_answers is not None:
            handlers["ApplyStream"] = grpc.stream_stream_rpc_method_handler(
                self._apply_stream,
                request_deserializer=acker_pb2.ApplyRequest.FromString,
                response_serializer=acker_pb2.ApplyAck.SerializeToString,
            )
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("acker_service.v1.Acker", handlers),)
        )
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _apply(self, request, context):
        self.applied.extend(request.root_ids)
        return acker_pb2.ApplyResponse(applied=len(request.kinds))

    def _apply_stream(self, requests, context):
        self.streams += 1
        answer = self._answers[min(self.streams, len(self._answers)) - 1]
        for sequence, request in enumerate(requests, 1):
            if answer:
                self.applied.extend(request.root_ids)
                yield acker_pb2.ApplyAck(sequence=sequence, applied=len(request.kinds))

    def stop(self) -> None:
        self._server.stop(0)


@pytest.fixture
def old_acker():
    servers: list[_OldAcker] = []

    def make(**kwargs) -> _OldAcker:
        servers.append(_OldAcker(**kwargs))
        return servers[-1]

    yield make
    for server in servers:
        server.stop()


@pytest.mark.parametrize("verify", [True, False])
def test_an_acker_without_the_stream_gets_unary_applies(old_acker, make_client, verify):
    """Verified: its Describe lacks apply_stream, so Apply is used; unverified: the stream's UNIMPLEMENTED turns to Apply.

    Either way the batch is applied once and no error reaches the caller.
    """
    acker = old_acker()
    client = make_client([acker.address], verify=verify)
    roots = [new_id() for _ in range(5)]
    for root in roots:
        client.init(root, 1, "old")
    client.flush()
    assert sorted(acker.applied) == sorted(roots)
    assert client.stats.batches_failed == 0 and client.stats.batches_sent >= 1


def test_an_overdue_ack_fails_the_batch_and_the_retry_goes_on_a_new_stream(old_acker, make_client):
    """The first stream never answers: the batch's deadline passes, the stream is dropped, a new one delivers it."""
    acker = old_acker(stream_answers=[False, True])
    client = make_client([acker.address], verify=False, deadline=0.5, wait_for_shard=30.0)
    root = new_id()
    client.init(root, 1, "overdue")
    client.flush()
    assert acker.applied == [root]
    assert acker.streams == 2
    assert client.stats.batches_retried == 1 and client.stats.batches_failed == 0


def test_the_unary_api_stays_served(make_ackers):
    """A client told not to stream (apply_stream=False) sends each batch as an Apply call, as before."""
    (server,) = make_ackers(1, message_timeout=60.0)
    with ClusterClient([server.address], apply_stream=False) as client:
        root = new_id()
        client.init(root, 1, "unary")
        client.flush()
        wait_until(lambda: _pending(server) == {root})
    assert (_calls(server, "Apply"), _calls(server, "ApplyStream")) == (1, 0)


def test_a_stream_that_cannot_open_fails_each_batch_unavailable():
    """Regression: with wait_for_ready off (replicas 2) and no acker listening, a new stream fails at once.

    A batch handed to such a stream must fail UNAVAILABLE (delivery retries it
    or drops it as covered by its replica); it used to raise RuntimeError out of
    ``future()``, which killed the background send silently and left its
    batches neither delivered nor reported (the blips test lost trees).
    """
    from acker_client.apply_stream import ApplyChannel

    with socket_nobody_listens() as address, grpc.insecure_channel(address) as channel:
        unary = channel.unary_unary("/acker_service.v1.Acker/Apply")
        apply = ApplyChannel(channel, unary)
        for _ in range(30):
            with pytest.raises(grpc.RpcError) as caught:
                apply.future(b"", timeout=5.0, wait_for_ready=False).result()
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


class socket_nobody_listens:
    """A 127.0.0.1 address whose port was free a moment ago (bound, then closed): connections are refused."""

    def __enter__(self) -> str:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return f"127.0.0.1:{probe.getsockname()[1]}"

    def __exit__(self, *exc_info) -> None:
        return None


def test_streams_are_closed_before_a_fork_and_reopened_after(make_ackers, make_client):
    """The before-fork hook leaves no reader thread waiting inside gRPC; the next batch opens a new stream."""
    from acker_client.apply_stream import close_streams_before_fork

    (server,) = make_ackers(1, message_timeout=60.0)
    client = make_client([server.address])
    client.init(new_id(), 1, "fork")
    client.flush()
    assert any(t.name == "acker-client-apply-stream" and t.is_alive() for t in threading.enumerate())
    close_streams_before_fork()  # what os.fork() runs first
    assert not any(t.name == "acker-client-apply-stream" and t.is_alive() for t in threading.enumerate())
    client.init(new_id(), 1, "fork")
    client.flush()
    assert _calls(server, "ApplyStream") == 2 and len(_pending(server)) == 2
