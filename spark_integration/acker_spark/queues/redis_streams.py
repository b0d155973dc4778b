"""Redis Streams as a queue source: a consumer group read with XREADGROUP, each entry XACKed once its output is committed.

A message stays in the group's pending entries list (PEL) from its read to its
ack, so nothing a driver held is lost when it dies: :meth:`RedisStreamSource.read`
returns first this consumer's own pending entries (a restarted driver reads
what its killed run held), then entries other consumers left pending longer
than ``claim_idle`` seconds (``XAUTOCLAIM``: a dead consumer's messages), then
new entries (``XREADGROUP >``). Every read counts a delivery at the broker;
``deliveries`` is the entry's ``times_delivered`` from ``XPENDING``.

Dead letters go to ``dead_letter_stream`` (default ``<stream>:dead``) with the
entry's fields plus ``acker_source_id``, ``acker_cause`` and ``acker_group``,
in one Lua script with the ``XACK``: an entry is moved iff the ack removed it
from the PEL, so a dead-lettering repeated after a crash adds nothing twice.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from .contract import Message, QueueSource

__all__ = ["RedisStreamSource"]

log = logging.getLogger(__name__)

ACK_CHUNK = 1_000
"""Entry ids per XACK / script call (one round trip each)."""

_DEAD_LETTER = """
local stream, dead = KEYS[1], KEYS[2]
local group = ARGV[1]
local moved = 0
for i = 2, #ARGV, 2 do
  local id, cause = ARGV[i], ARGV[i + 1]
  local entry = redis.call('XRANGE', stream, id, id)
  if redis.call('XACK', stream, group, id) == 1 then
    local fields = {'acker_source_id', id, 'acker_cause', cause, 'acker_group', group}
    if #entry > 0 then
      for _, value in ipairs(entry[1][2]) do table.insert(fields, value) end
    end
    redis.call('XADD', dead, '*', unpack(fields))
    moved = moved + 1
  end
end
return moved
"""


class RedisStreamSource(QueueSource):
    """The entries of ``stream`` read by consumer ``consumer`` of group ``group``; the payload is field ``field``.

    ``redis``: a ``redis.Redis`` client or a URL (``redis://host:6379/0``).
    The group is created at the stream's start (and the stream with it) when
    missing. ``decode``: payloads as UTF-8 text (else bytes). ``batch``: most
    entries held unacknowledged per batch (one SourcePipeline run each: large,
    so a drain's fixed cost is paid once, not per few hundred messages). Keep ``consumer`` the same across
    restarts of one job: a restarted driver finds its pending entries by it.
    An entry without ``field`` is dead-lettered at once (cause ``no field``):
    it has no payload to process.
    """

    rereads_held = True  # read() starts with this consumer's pending entries

    def __init__(
        self,
        redis: Any,
        stream: str,
        group: str,
        *,
        consumer: str = "acker-drain",
        field: str = "data",
        dead_letter_stream: str | None = None,
        batch: int = 100_000,
        claim_idle: float = 60.0,
        decode: bool = True,
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch must be at least 1 message, got {batch}")
        if isinstance(redis, str):
            redis = _client(redis)
        self.redis = redis
        self.stream, self.group, self.consumer, self.field = stream, group, consumer, field
        self.dead_letter_stream = dead_letter_stream or f"{stream}:dead"
        self.batch = batch
        self.claim_idle_ms = int(claim_idle * 1000)
        self.decode = decode
        self._move = self.redis.register_script(_DEAD_LETTER)
        self._ensure_group()

    def describe(self) -> str:
        """One line for logs."""
        return f"Redis stream {self.stream!r} group {self.group!r} consumer {self.consumer!r}"

    def _ensure_group(self) -> None:
        from redis.exceptions import ResponseError

        try:
            self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise

    # -- reading ----------------------------------------------------------------------------

    def read(self, limit: int) -> list[Message]:
        """Own pending entries, then others' idle ones (XAUTOCLAIM), then new ones: up to ``limit`` messages."""
        entries: list[tuple[bytes, dict[bytes, bytes] | None]] = []
        own = self.redis.xreadgroup(self.group, self.consumer, {self.stream: "0"}, count=limit)
        entries.extend(own[0][1] if own else [])
        start: Any = "0-0"
        while len(entries) < limit:
            start, claimed, _deleted = self.redis.xautoclaim(
                self.stream, self.group, self.consumer, self.claim_idle_ms, start, count=limit - len(entries)
            )
            entries.extend(claimed)
            if start in (b"0-0", "0-0"):
                break
        if len(entries) < limit:
            new = self.redis.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=limit - len(entries))
            entries.extend(new[0][1] if new else [])
        return self._messages(entries)

    def _messages(self, entries: list[tuple[bytes, dict[bytes, bytes] | None]]) -> list[Message]:
        """Each entry as a Message with its delivery count; entries trimmed away or without the field leave."""
        if not entries:
            return []
        counts = {
            _text(p["message_id"]): int(p["times_delivered"])
            for p in self.redis.xpending_range(
                self.stream, self.group, "-", "+", len(entries), consumername=self.consumer
            )
        }
        messages, gone, unusable = [], [], []
        key = self.field.encode()
        for raw_id, fields in entries:
            entry_id = _text(raw_id)
            if not fields:  # trimmed from the stream while pending: nothing left to process
                gone.append(entry_id)
                continue
            if key not in fields:
                unusable.append((entry_id, f"ValueError: the entry has no field {self.field!r} (its payload)"))
                continue
            value = fields[key]
            payload = value.decode("utf-8", errors="replace") if self.decode else value
            messages.append(Message(entry_id, payload, counts.get(entry_id, 1)))
        if gone:
            log.warning("%s: %d pending entries were trimmed from the stream; acked", self.describe(), len(gone))
            self.ack(gone)
        if unusable:
            log.warning("%s: %d entries without field %r dead-lettered", self.describe(), len(unusable), self.field)
            self.dead_letter(unusable)
        return messages

    # -- settling ---------------------------------------------------------------------------

    def ack(self, ids: Sequence[str]) -> int:
        """XACK the entries, in chunks; how many were still pending."""
        done = 0
        for at in range(0, len(ids), ACK_CHUNK):
            done += int(self.redis.xack(self.stream, self.group, *ids[at : at + ACK_CHUNK]))
        return done

    def release(self, ids: Sequence[str]) -> None:
        """Leave the entries pending but idle past ``claim_idle``, so the next read of any consumer claims them."""
        for at in range(0, len(ids), ACK_CHUNK):
            self.redis.xclaim(
                self.stream,
                self.group,
                self.consumer,
                0,
                list(ids[at : at + ACK_CHUNK]),
                idle=self.claim_idle_ms + 1,
                justid=True,  # no delivery counted: the messages were not processed again
            )

    def dead_letter(self, letters: Sequence[tuple[str, str]]) -> int:
        """Copy each entry with its cause to the dead-letter stream and XACK it, atomically; how many moved."""
        moved = 0
        for at in range(0, len(letters), ACK_CHUNK):
            args: list[str] = [self.group]
            for entry_id, cause in letters[at : at + ACK_CHUNK]:
                args += [entry_id, cause]
            moved += int(self._move(keys=[self.stream, self.dead_letter_stream], args=args))
        return moved

    def close(self) -> None:
        """Close the client's connections."""
        self.redis.close()


def _client(url: str) -> Any:
    """A client for ``url`` that rides out a server restart (about 10 s of retries).

    Every command the source sends is safe to repeat: XACK and the dead-letter
    script are idempotent, and entries a lost XREADGROUP reply delivered are
    in this consumer's pending list, where the next read finds them.
    """
    import redis as redis_py
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    errors = redis_py.exceptions
    return redis_py.Redis.from_url(
        url,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 15),
        retry_on_error=[errors.ConnectionError, errors.TimeoutError, errors.BusyLoadingError],
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
