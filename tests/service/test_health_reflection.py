"""The standard health service and server reflection on a real acker server."""

from __future__ import annotations

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from acker_service.server import SERVICE_NAME


def test_health_reports_serving_for_server_and_service(make_server):
    """Health answers SERVING for the whole server ("") and for acker_service.v1.Acker."""
    server = make_server()
    with grpc.insecure_channel(server.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE_NAME):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        try:
            stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.NOT_FOUND
        else:
            raise AssertionError("an unknown service must not be reported healthy")


def test_health_watch_sees_not_serving_at_shutdown(make_server):
    """A Watch stream receives NOT_SERVING when the server begins to stop."""
    server = make_server()
    with grpc.insecure_channel(server.address) as channel:
        request = health_pb2.HealthCheckRequest(service="")
        watch = health_pb2_grpc.HealthStub(channel).Watch(request, timeout=30)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        server.stop(grace=1.0)
        statuses = []
        try:
            for reply in watch:
                statuses.append(reply.status)
        except grpc.RpcError:
            pass  # the stream ends when the server is gone
        assert statuses[:1] == [health_pb2.HealthCheckResponse.NOT_SERVING]


def test_reflection_lists_and_describes_the_acker_service(make_server):
    """Reflection lists the Acker, health and reflection services and resolves Acker's methods."""
    server = make_server()
    with grpc.insecure_channel(server.address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {SERVICE_NAME, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= services
        acker = DescriptorPool(database).FindServiceByName(SERVICE_NAME)
        assert {m.name for m in acker.methods} == {"Apply", "Subscribe", "Describe", "Inspect", "ForceFail"}
