"""The shared wire vocabulary: enums tied to the .proto, limits, sharding and the id and name checks."""

from __future__ import annotations

from enum import IntEnum

import pytest
from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import (
    MAX_ID,
    MAX_SPOUT_NAME_BYTES,
    OpKind,
    Outcome,
    check_id,
    check_mirrors,
    check_root,
    check_spout_name,
    shard_of,
)


class TestEnums:
    def test_enums_carry_the_proto_numbers(self):
        """Every OpKind and Outcome member has the number of the proto value of the same name."""
        assert {k.name: int(k) for k in OpKind} == {
            n.removeprefix("OP_KIND_"): v for n, v in acker_pb2.OpKind.items() if v
        }
        assert {o.name: int(o) for o in Outcome} == {
            n.removeprefix("OUTCOME_"): v for n, v in acker_pb2.Outcome.items() if v
        }

    def test_a_missing_member_is_caught(self):
        """An enum lacking a proto value fails the mirror check with a message naming both sides."""

        class Partial(IntEnum):
            ACKED = 1

        with pytest.raises(ImportError, match="proto enum"):
            check_mirrors(Partial, acker_pb2.DESCRIPTOR.enum_types_by_name["Outcome"], "OUTCOME_")

    def test_a_renumbered_member_is_caught(self):
        """An enum whose numbers differ from the proto's fails the mirror check."""
        Swapped = IntEnum("Swapped", {"INIT": 2, "ACK": 1, "FAIL": 3, "RESET_TIMEOUT": 4})
        with pytest.raises(ImportError):
            check_mirrors(Swapped, acker_pb2.DESCRIPTOR.enum_types_by_name["OpKind"], "OP_KIND_")


class TestChecks:
    def test_shard_of_is_root_modulo_count(self):
        """Root r belongs to shard r % n."""
        assert [shard_of(r, 3) for r in (3, 4, 5, MAX_ID)] == [0, 1, 2, MAX_ID % 3]

    @pytest.mark.parametrize("root", [0, -1, MAX_ID + 1])
    def test_bad_roots_are_refused(self, root):
        """Root ids must be non-zero 64-bit unsigned integers."""
        with pytest.raises(ValueError, match="non-zero 64-bit"):
            check_root(root)

    def test_bad_values_name_what_they_are(self):
        """A bad value is reported under the caller's name for it, with its root."""
        check_id(1, MAX_ID)
        with pytest.raises(ValueError, match="edge id -1 for root 7"):
            check_id(7, -1, what="edge id")

    def test_spout_names_are_limited_in_utf8_bytes(self):
        """Spout names are 1 to MAX_SPOUT_NAME_BYTES bytes of UTF-8 (not characters)."""
        check_spout_name("x" * MAX_SPOUT_NAME_BYTES)
        for bad in ("", "é" * (MAX_SPOUT_NAME_BYTES // 2 + 1)):
            with pytest.raises(ValueError, match=f"1 to {MAX_SPOUT_NAME_BYTES} bytes"):
                check_spout_name(bad)
