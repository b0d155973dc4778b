"""A TCP proxy that breaks the network on demand, for the blip tests: cut, delay, half-open, slow reader, lost responses.

One :class:`BlipProxy` listens on a free 127.0.0.1 port and forwards every
connection to one upstream address, with two threads per connection (one per
direction). What it can do to the traffic, each for a bounded time:

- :meth:`cut`: reset every open connection and refuse new ones (connections are
  accepted and reset at once), like a cable pulled out and put back; with
  ``others_only=True`` only the connections made by other processes than this
  one (a Spark job's executors, while the driver in this process keeps its own),
  which is one machine's network cut while the driver's stays up;
- :meth:`half_open`: keep the open connections but silently swallow every byte
  both ways, and refuse new ones, like a peer host that vanished without a FIN
  (only keepalive can tell);
- :meth:`set_delay`: hold each chunk for some seconds before forwarding it;
- :meth:`slow_reader`: forward downstream (acker to client) at a few bytes per
  second, like a client that reads slowly;
- :meth:`swallow_responses`: forward requests but drop every response, then
  reset the connections: the acker applied what it received and the client
  never hears so (the ambiguous failure).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time

__all__ = ["BlipProxy"]

_CHUNK = 65536


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a broken network would, instead of a polite FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    # close() alone does not wake the pump thread blocked in recv() on this socket, and the
    # kernel sends the RST only once that recv returns: on an idle connection (an outcome
    # stream between batches) not before the next keepalive ping. shutdown(SHUT_RD) wakes it
    # without sending a FIN.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


def _peer_in_this_process(sock: socket.socket) -> bool:
    """Whether the loopback client end of an accepted ``sock`` is a socket of this very process (Linux /proc).

    The kernel's TCP table names the inode of the connecting socket (its local
    port is our peer's port, its remote port our listening port); this process
    owns it if one of its file descriptors is that socket.
    """
    try:
        peer_port = sock.getpeername()[1]
        our_port = sock.getsockname()[1]
    except OSError:
        return False
    suffix_local, suffix_remote = f":{peer_port:04X}", f":{our_port:04X}"
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            for row in rows.readlines()[1:]:
                fields = row.split()
                if fields[1].endswith(suffix_local) and fields[2].endswith(suffix_remote):
                    inode = fields[9]
                    break
        if inode is not None:
            break
    if inode is None:
        return False
    wanted = f"socket:[{inode}]"
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == wanted:
                return True
    return False


class _Link:
    """One proxied connection: the client-side and upstream sockets."""

    def __init__(self, downstream: socket.socket, upstream: socket.socket) -> None:
        self.downstream = downstream
        self.upstream = upstream
        self.swallow = False  # half-open: bytes are read and discarded both ways
        self.drop_responses = False
        self.own = _peer_in_this_process(downstream)  # made by this process (spared by others_only cuts)

    def close(self) -> None:
        _reset(self.downstream)
        _reset(self.upstream)


class BlipProxy:
    """Forwards 127.0.0.1:``port`` to ``upstream`` ("host:port"); break it with the methods below."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        self._upstream = (host or "127.0.0.1", int(port))
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._refuse_until = 0.0
        self._refuse_others_until = 0.0  # others_only cuts: connections from other processes refused
        self._delay = 0.0
        self._slow_bytes_per_s: float | None = None
        self._slow_until = 0.0
        self._closed = False
        self.connections = 0  # accepted and forwarded
        self.refused = 0
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"blip-proxy-{self.port}", daemon=True)

    @property
    def address(self) -> str:
        """Where clients connect."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> BlipProxy:
        """Start accepting."""
        self._acceptor.start()
        return self

    # -- faults ----------------------------------------------------------------

    def cut(self, seconds: float, *, others_only: bool = False) -> None:
        """Reset every open connection and refuse new ones for ``seconds`` (returns at once).

        ``others_only``: only the connections of other processes (this process's own go on).
        """
        with self._lock:
            if others_only:
                self._refuse_others_until = time.monotonic() + seconds
                links = {link for link in self._links if not link.own}
                self._links -= links
            else:
                self._refuse_until = time.monotonic() + seconds
                links, self._links = self._links, set()
        for link in links:
            link.close()

    def half_open(self, seconds: float, *, others_only: bool = False) -> None:
        """Swallow all bytes of the open connections (forever) and refuse new connections for ``seconds``.

        ``others_only``: only the connections of other processes (this process's own go on).
        """
        with self._lock:
            if others_only:
                self._refuse_others_until = time.monotonic() + seconds
            else:
                self._refuse_until = time.monotonic() + seconds
            for link in self._links:
                if not (others_only and link.own):
                    link.swallow = True

    def swallow_responses(self, then_reset_after: float = 0.3) -> None:
        """Drop every response byte of the open connections, and reset them ``then_reset_after`` s later."""
        with self._lock:
            links = list(self._links)
            for link in links:
                link.drop_responses = True

        def reset_later() -> None:
            time.sleep(then_reset_after)
            with self._lock:
                for link in links:
                    self._links.discard(link)
            for link in links:
                link.close()

        threading.Thread(target=reset_later, daemon=True).start()

    def set_delay(self, seconds: float) -> None:
        """Hold every chunk ``seconds`` before forwarding it (0: no delay)."""
        self._delay = seconds

    def slow_reader(self, bytes_per_second: float, seconds: float) -> None:
        """Forward acker-to-client bytes at ``bytes_per_second`` for ``seconds``."""
        with self._lock:
            self._slow_bytes_per_s = bytes_per_second
            self._slow_until = time.monotonic() + seconds

    @property
    def open_connections(self) -> int:
        """Connections currently forwarded."""
        with self._lock:
            return len(self._links)

    def close(self) -> None:
        """Stop accepting and reset every connection."""
        self._closed = True
        # close() alone does not wake a thread blocked in accept() on Linux (the join below
        # would wait its whole 2 s); shutdown() does, and accept() then raises.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            links, self._links = self._links, set()
        for link in links:
            link.close()
        self._acceptor.join(2.0)

    def __enter__(self) -> BlipProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- forwarding ------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            now = time.monotonic()
            if now < self._refuse_until or (now < self._refuse_others_until and not _peer_in_this_process(downstream)):
                self.refused += 1
                _reset(downstream)
                continue
            try:
                upstream = socket.create_connection(self._upstream, timeout=2.0)
                upstream.settimeout(None)
            except OSError:
                # The acker itself is down: the client sees its connection fail.
                _reset(downstream)
                continue
            for sock in (downstream, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(downstream, upstream)
            with self._lock:
                if self._closed:
                    link.close()
                    return
                self._links.add(link)
                self.connections += 1
            for src, dst, is_response in ((downstream, upstream, False), (upstream, downstream, True)):
                threading.Thread(target=self._pump, args=(link, src, dst, is_response), daemon=True).start()

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket, is_response: bool) -> None:
        try:
            while True:
                data = src.recv(_CHUNK)
                if not data:
                    break
                if link.swallow or (is_response and link.drop_responses):
                    continue
                if self._delay:
                    time.sleep(self._delay)
                if is_response and self._slow_bytes_per_s and time.monotonic() < self._slow_until:
                    self._send_slowly(dst, data)
                else:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            # One side ended: end the other too (a swallowed link ends when the
            # client's keepalive gives up on it).
            with self._lock:
                self._links.discard(link)
            link.close()

    def _send_slowly(self, dst: socket.socket, data: bytes) -> None:
        rate = self._slow_bytes_per_s or 1.0
        step = max(1, int(rate / 10))
        for i in range(0, len(data), step):
            dst.sendall(data[i : i + step])
            time.sleep(step / rate)
