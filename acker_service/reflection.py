"""Server reflection under both names clients use: ``grpc.reflection.v1`` and ``grpc.reflection.v1alpha``.

grpcio-reflection serves v1alpha only, so a client that speaks only v1
(newer grpcurl, Postman, gRPC UI, most non-Python tools) got UNIMPLEMENTED. v1
is v1alpha promoted unchanged: the same messages, fields and numbers under
another package (grpc-proto's ``grpc/reflection/v1/reflection.proto``), so one
grpcio-reflection servicer answers both, and only v1's descriptor is made here,
from v1alpha's, so that v1 itself can be listed and described.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha

__all__ = ["V1_SERVICE_NAME", "V1ALPHA_SERVICE_NAME", "enable_reflection"]

V1ALPHA_SERVICE_NAME = reflection.SERVICE_NAME
V1_SERVICE_NAME = "grpc.reflection.v1.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def enable_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection, v1 and v1alpha, listing ``service_names`` and both reflection services."""
    _add_v1_descriptor(descriptor_pool.Default())
    names = (*service_names, V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection.enable_server_reflection(names, server)
    # v1's messages are v1alpha's byte for byte: its requests decode as, and its answers encode from, v1alpha's.
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=v1alpha.ServerReflectionRequest.FromString,
        response_serializer=v1alpha.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1_SERVICE_NAME, {"ServerReflectionInfo": handler}),)
    )


def _add_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    """Add v1's file descriptor (v1alpha's renamed) to ``pool``, once per process."""
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    file = descriptor_pb2.FileDescriptorProto()
    v1alpha.DESCRIPTOR.CopyToProto(file)
    file.name, file.package = _V1_FILE, "grpc.reflection.v1"
    for message in file.message_type:
        for field in message.field:
            if field.type_name:  # message fields only: setting it on a scalar field would make it invalid
                field.type_name = _v1(field.type_name)
    for service in file.service:
        for method in service.method:
            method.input_type, method.output_type = _v1(method.input_type), _v1(method.output_type)
    pool.Add(file)


def _v1(type_name: str) -> str:
    return type_name.replace(".grpc.reflection.v1alpha.", ".grpc.reflection.v1.")
