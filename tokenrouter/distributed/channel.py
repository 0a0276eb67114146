"""A direct line for hand-offs between workers in different processes, set up through Ray.

Why: a Ray actor call costs its sender ~0.3 ms idle and 1-2 ms in a busy actor on a shared
CPU, and as much again to dispatch on the receiving side; a step that hands off to a peer paid
that on its critical path (docs/distributed.md has the numbers). So each actor listens on a TCP
socket of its node; its address and a secret made for the engine go to the peers through Ray
(`WorkerActor.connect`); a peer's envelopes then travel as length-prefixed frames
(`wire.dumps` bytes) on one connection per sender, read by a thread of the receiver that
applies them as the Ray `post` method would. A connection accepts frames only after the
engine's secret: the port takes nothing from strangers.

Ray still decides whether a peer is alive, and still carries everything else (the caller's
submissions and aborts, the events back to the caller, calls). A frame that cannot be sent goes
by a Ray call instead, and so does everything after it: the receiver orders envelopes by
their numbers, whichever way they came (`in_order.py`).
"""

from __future__ import annotations

import hmac
import logging
import socket
import struct
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_HEADER = struct.Struct("!I")
MAX_FRAME = 1 << 30


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class ChannelServer:
    """Listens on `host`; each accepted connection gets a reader thread that hands its frames
    to `on_frame` once the connection has sent `secret`."""

    def __init__(self, host: str, secret: bytes, on_frame: Callable[[bytes], None]):
        self.secret = secret
        self.on_frame = on_frame
        self._sock = socket.create_server((host, 0))
        self.address = (host, self._sock.getsockname()[1])
        self._closed = False
        threading.Thread(target=self._accept, name="tokenrouter-channel-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._read, args=(conn,), name="tokenrouter-channel-read", daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        with conn:
            try:
                hello = _recv_exact(conn, len(self.secret))
                if hello is None or not hmac.compare_digest(hello, self.secret):
                    log.warning("a connection to the hand-off channel without the engine's secret was refused")
                    return
                while True:
                    header = _recv_exact(conn, _HEADER.size)
                    if header is None:
                        return
                    (size,) = _HEADER.unpack(header)
                    if size > MAX_FRAME:
                        log.error("hand-off channel: a frame of %d bytes, closing the connection", size)
                        return
                    frame = _recv_exact(conn, size)
                    if frame is None:  # cut off mid-frame: the sender sends it again by Ray
                        return
                    self.on_frame(frame)
            except OSError as e:
                log.debug("hand-off channel connection ended: %s", e)
            except Exception:
                log.exception("hand-off channel: applying a frame failed")

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass


class Channel:
    """The sending end: `send(frame)` returns False if the connection is (or becomes) unusable."""

    def __init__(self, address: tuple[str, int], secret: bytes, timeout: float = 10.0):
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        try:
            sock = socket.create_connection(tuple(address), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(None)
            sock.sendall(secret)
            self._sock = sock
        except OSError as e:
            log.warning("no direct hand-off channel to %s (%s): hand-offs go by Ray calls", address, e)

    @property
    def usable(self) -> bool:
        return self._sock is not None

    def send(self, frame: bytes) -> bool:
        with self._lock:
            if self._sock is None:
                return False
            try:
                self._sock.sendall(_HEADER.pack(len(frame)) + frame)
                return True
            except OSError as e:
                log.warning("the direct hand-off channel broke (%s): hand-offs go by Ray calls", e)
                self._close()
                return False

    def _close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    def close(self) -> None:
        with self._lock:
            self._close()
