"""Fork safety: children of a process that used the client get fresh channels and never send its buffer."""

from __future__ import annotations

import os
import struct

import pytest
from acker_client import BoltCollector, ClusterClient, MessageId, TrackedTuple, new_id
from acker_client.testing import local_cluster

CHILDREN = 16
IDS_PER_CHILD = 200
TREES_PER_CHILD = 20


def _child(client: ClusterClient, write_fd: int) -> int:
    """Body of a forked child: draw ids, run trees through the inherited client, report; returns exit code."""
    ids = [new_id() for _ in range(IDS_PER_CHILD)]
    bolt = BoltCollector(client)

    for _ in range(TREES_PER_CHILD):
        root, edge = new_id(), new_id()
        client.init(root, edge, "fork-children")
        t = TrackedTuple("x", MessageId.single(root, edge))
        kid = bolt.emit("y", [t])
        bolt.ack(t)
        bolt.ack(kid)
    client.flush()  # raises (exit code 1) unless every batch was applied within the deadline
    os.write(write_fd, struct.pack(f"<{IDS_PER_CHILD}Q", *ids))
    client.close()
    return 0


@pytest.fixture(scope="module")
def process_ackers():
    """Two ackers as separate processes: the forking parent must run no gRPC server threads of its own."""
    with local_cluster(2, message_timeout=60.0, processes=True) as cluster:
        yield cluster


# Python 3.12+ warns (DeprecationWarning) when forking a process that runs threads, which this test
# does on purpose: PySpark's daemon forks workers the same way, and the client must survive it.
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_forked_children_use_fresh_channels(process_ackers, make_client):
    """16 forked children each complete their trees within the deadline, their ids never collide, and none
    sends the parent's buffered ack."""
    client = make_client(
        process_ackers.addresses, flush_interval=3600.0, send_when_idle=False, batch_size=10_000, deadline=10.0
    )
    # The parent's tree: init applied, its completing ack left in the parent's buffer across the fork.
    root, edge = new_id(), new_id()
    client.init(root, edge, "fork-parent")
    client.flush()
    client.ack(root, edge)

    children = []
    for _ in range(CHILDREN):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                os.close(read_fd)
                code = _child(client, write_fd)
            finally:
                os._exit(code)
        os.close(write_fd)
        children.append((pid, read_fd))

    ids = []
    for pid, read_fd in children:
        with os.fdopen(read_fd, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        ids.extend(struct.unpack(f"<{IDS_PER_CHILD}Q", data))
    assert len(ids) == CHILDREN * IDS_PER_CHILD and len(set(ids)) == len(ids)

    # The children's trees all completed: shard 0 + shard 1 pending is just the parent's tree.
    pending = [client.describe(i).pending_trees for i in range(2)]
    assert sum(pending) == 1, pending
    assert pending[root % 2] == 1  # no child sent the parent's buffered ack
    client.flush()
    assert sum(client.describe(i).pending_trees for i in range(2)) == 0
