"""Keepalive over a long idle stream: the server never answers the project's own client with too_many_pings.

The shipped pair pings every 4 s against a server that accepts one ping per
second. The test keeps that ratio through the same option builders with the
shortest interval gRPC's client keeps here (about 1 s: shorter settings are
sent about once a second anyway) against a 0.25 s server minimum, and stays
idle for fifteen pings, past the server's strike limit. A server that did not
apply its minimum counts every one of those pings as a strike (gRPC's default
minimum is five minutes) and sends GOAWAY too_many_pings after the eleventh:
the defect of issue 21, seen about 40 s into an idle stream with the default
4 s keepalive.
"""

from __future__ import annotations

import threading
import time

import grpc
from acker_protocol import grpc_options
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc
from acker_protocol.wire import OpKind, Outcome

from acker_service.config import ServerConfig
from acker_service.server import AckerServer

KEEPALIVE_MS = 1_000
SERVER_MIN_PING_INTERVAL = 0.25  # the shipped ratio: a quarter of the client's keepalive interval
IDLE_PINGS = grpc_options.MAX_PING_STRIKES + 5  # past the strike limit


def test_an_idle_outcome_stream_outlives_many_keepalive_pings():
    config = ServerConfig(host="127.0.0.1", port=0, grace=0.5, min_ping_interval=SERVER_MIN_PING_INTERVAL)
    server = AckerServer(config).start()
    try:
        _idle_stream_then_an_outcome(server)
    finally:
        server.stop(0)


def _idle_stream_then_an_outcome(server: AckerServer) -> None:
    options = grpc_options.client_options(keepalive_time_ms=KEEPALIVE_MS) + [("grpc.use_local_subchannel_pool", 1)]
    with grpc.insecure_channel(server.address, options=options) as channel:
        stub = acker_pb2_grpc.AckerStub(channel)
        stream = stub.Subscribe(acker_pb2.SubscribeRequest(spout="idle"), timeout=60, wait_for_ready=True)
        received: list[acker_pb2.OutcomeBatch] = []
        ended: list[grpc.RpcError] = []
        arrived = threading.Event()

        def read() -> None:
            try:
                for batch in stream:
                    if batch.root_ids:  # not the empty batch that opens the stream
                        received.append(batch)
                        arrived.set()
            except grpc.RpcError as exc:
                ended.append(exc)
                arrived.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        # Idle: nothing is sent on the stream while the client's keepalive pings go out.
        time.sleep(IDLE_PINGS * KEEPALIVE_MS / 1000)
        assert not ended, f"the idle stream was closed: {ended[0].code()} {ended[0].details()}"
        # The same stream still carries outcomes: a tree started and completed now is reported on it.
        stub.Apply(
            acker_pb2.ApplyRequest(
                kinds=[int(OpKind.INIT), int(OpKind.ACK)], root_ids=[7, 7], values=[5, 5], spouts=["idle"]
            ),
            timeout=10,
        )
        assert arrived.wait(30)
        stream.cancel()
        reader.join(10)
    assert not ended or ended[0].code() == grpc.StatusCode.CANCELLED, ended[0].details()
    assert received and list(received[0].root_ids) == [7] and list(received[0].outcomes) == [int(Outcome.ACKED)]
