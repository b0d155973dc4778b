"""The acker's moving wing: trees moving between ackers, and the layout that says who owns them.

One job per module:

* :mod:`.layout` - the layout (which shard owns which roots) and the state machine of a change;
* :mod:`.layout_file` - the last committed layout on disk, so a restart comes back in it;
* :mod:`.membership` - :class:`~.membership.Membership`, what a :class:`~acker_service.shard.Shard`
  hands every move to: Apply while trees move, prepare, cut, handoffs, commit, snapshots;
* :mod:`.request_parts` - a request applied in parts: now, or held per source;
* :mod:`.held` - the operations held until their trees' entries arrive, bounded;
* :mod:`.reshard` - the handoffs of a cut: slices, chunks, sending them to the new owners;
* :mod:`.peers` - how an acker reaches the other ackers (plaintext, TLS, mutual TLS);
* :mod:`.catchup` - a restarted replica's catch-up rules: ranges awaited, operations held;
* :mod:`.catchup_peer` - the catch-up's calls: snapshots asked of and streamed to partners;
* :mod:`.transfers` - the trees copied in and out, and the conservation identity they make checkable.

The wing sits above the ledger and its vocabulary (``batch``, ``ledger``,
``handoff``, ``config``) and below what serves (``shard``, ``servicer``,
``server``); tests/packaging/test_layering.py keeps it there. Apply requests
are taken apart with the codec the client shares, :mod:`acker_protocol.apply_codec`.
"""
