"""The standard health service and server reflection on a real acker server."""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pb2, message_factory
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha_reflection_pb2
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
        assert {m.name for m in acker.methods} == {
            "Apply",
            "ApplyStream",
            "Subscribe",
            "Describe",
            "Inspect",
            "ForceFail",
            "PrepareLayout",
            "CutLayout",
            "CommitLayout",
            "Handoff",
            "Snapshot",
        }


V1_METHOD = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"


def _v1_messages() -> tuple[type, type]:
    """The v1 reflection request and response types, built on the client side from their own descriptors.

    grpcio-reflection ships v1alpha only; v1 is the same protocol under the
    package grpc.reflection.v1 (grpc-proto's reflection/v1/reflection.proto).
    """
    file = descriptor_pb2.FileDescriptorProto()
    v1alpha_reflection_pb2.DESCRIPTOR.CopyToProto(file)
    file.name = "client_side/grpc/reflection/v1/reflection.proto"
    file.package = "grpc.reflection.v1"
    for message in file.message_type:
        for field in message.field:
            if field.type_name:
                field.type_name = field.type_name.replace(".v1alpha.", ".v1.")
    for method in file.service[0].method:
        method.input_type = method.input_type.replace(".v1alpha.", ".v1.")
        method.output_type = method.output_type.replace(".v1alpha.", ".v1.")
    pool = DescriptorPool()
    pool.Add(file)
    request = message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionRequest"))
    response = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionResponse")
    )
    return request, response


def test_v1_reflection_lists_and_describes_the_acker_service(make_server):
    """A client that speaks only grpc.reflection.v1 lists the services and gets Acker's file descriptor."""
    request_type, response_type = _v1_messages()
    server = make_server()
    with grpc.insecure_channel(server.address) as channel:
        call = channel.stream_stream(
            V1_METHOD, request_serializer=request_type.SerializeToString, response_deserializer=response_type.FromString
        )
        requests = [
            request_type(list_services=""),
            request_type(file_containing_symbol=SERVICE_NAME),
            request_type(file_containing_symbol="grpc.reflection.v1.ServerReflection"),
        ]
        listed, described, itself = list(call(iter(requests), timeout=10))
    assert not itself.HasField("error_response"), itself.error_response.error_message
    services = {s.name for s in listed.list_services_response.service}
    assert {SERVICE_NAME, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} <= services
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(f)
        for f in described.file_descriptor_response.file_descriptor_proto
    ]
    acker = [s for f in files for s in f.service if f"{f.package}.{s.name}" == SERVICE_NAME]
    assert [m.name for m in acker[0].method][:4] == ["Apply", "ApplyStream", "Subscribe", "Describe"]
