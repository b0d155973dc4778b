"""Generated protobuf and gRPC modules of the acker_service.v1 API (do not edit; see scripts/generate_proto.py)."""
