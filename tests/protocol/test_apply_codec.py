"""The Apply request codec the acker and the client share: decode to columns, encode parts, split by owner."""

from __future__ import annotations

import numpy as np
import pytest
from acker_protocol.apply_codec import (
    UndecodableRequest,
    decode_apply_request,
    encode_part,
    split_by,
    split_by_owner,
)
from acker_protocol.v1 import acker_pb2


def _request(**fields) -> acker_pb2.ApplyRequest:
    base = dict(
        kinds=[1, 2, 2, 1], root_ids=[3, 4, 5, 6], values=[7, 8, 9, 10], dedup_keys=[0, 11, 12, 13],
        spouts=["a", "b"], spout_index=[1, 0, 0, 0],
    )  # fmt: skip
    return acker_pb2.ApplyRequest(**(base | fields))


def test_decoding_gives_every_field_as_columns():
    columns = decode_apply_request(_request().SerializeToString())
    assert columns.kinds.tolist() == [1, 2, 2, 1] and columns.roots.dtype == np.uint64
    assert (columns.roots.tolist(), columns.values.tolist()) == ([3, 4, 5, 6], [7, 8, 9, 10])
    assert (columns.dedup_keys.tolist(), columns.spouts, columns.spout_index.tolist()) == (
        [0, 11, 12, 13],
        ["a", "b"],
        [1, 0, 0, 0],
    )


def test_a_part_is_what_protobuf_writes_for_the_same_operations():
    columns = decode_apply_request(_request().SerializeToString())
    part = encode_part(columns, np.array([True, False, True, False]))
    expected = _request(
        kinds=[1, 2], root_ids=[3, 5], values=[7, 9], dedup_keys=[0, 12], spout_index=[1, 0]
    ).SerializeToString()
    assert part == expected


def test_absent_optional_fields_stay_absent_in_each_part():
    request = acker_pb2.ApplyRequest(kinds=[2, 2], root_ids=[4, 5], values=[1, 2])
    columns = decode_apply_request(request.SerializeToString())
    part = acker_pb2.ApplyRequest.FromString(encode_part(columns, np.array([False, True])))
    assert (list(part.root_ids), list(part.dedup_keys), list(part.spout_index), list(part.spouts)) == ([5], [], [], [])


def test_split_by_owner_keeps_each_owners_operations_in_order_with_every_field():
    parts = split_by_owner(_request().SerializeToString(), 2)
    assert sorted(parts) == [0, 1]
    even = acker_pb2.ApplyRequest.FromString(parts[0])
    odd = acker_pb2.ApplyRequest.FromString(parts[1])
    assert (list(even.root_ids), list(even.dedup_keys), list(even.spout_index)) == ([4, 6], [11, 13], [0, 0])
    assert (list(odd.root_ids), list(odd.dedup_keys), list(odd.spout_index)) == ([3, 5], [0, 12], [1, 0])
    assert list(even.spouts) == list(odd.spouts) == ["a", "b"]


def test_split_by_leaves_out_negative_keys():
    columns = decode_apply_request(_request().SerializeToString())
    parts = split_by(columns, np.array([-1, 2, -1, 2]))
    assert list(parts) == [2] and list(acker_pb2.ApplyRequest.FromString(parts[2]).root_ids) == [4, 6]


def test_bytes_that_are_no_request_are_refused_with_the_protocol_named():
    with pytest.raises(UndecodableRequest, match="not a valid acker_service.v1.ApplyRequest") as caught:
        decode_apply_request(b"\xff\xff\xff")
    assert isinstance(caught.value, ValueError) and caught.value.detail
