"""One HTTP request and its answer under a deadline for the whole call, and a cancel event that ends it at once.

A socket timeout bounds each read, not the call: a target that sends one header line a second never trips it, and
held a worker thread for as long as it liked (and its answer, completed after minutes, was taken for a success).
Here the socket is non-blocking and every wait (connect, TLS handshake, sending, the status line, each header, the
body) polls for readiness in slices of POLL_SECONDS, asking the `Budget` each time whether the deadline has passed
or the cancel event is set. So a call ends at most one slice after either, whatever the target does, and the
answer's body is read within the same deadline: a body cut short is an incomplete call, not an answer.
"""

from __future__ import annotations

import errno
import http.client
import io
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any

# How long one wait on the socket may block before the deadline and the cancel event are looked at again.
POLL_SECONDS = 0.05
# The most of a response body read; the status has answered by then, and a target streaming more is not waited for.
MAX_BODY_BYTES = 1024 * 1024


class CallEnded(Exception):
    """The call was ended before it completed: its deadline passed, or it was canceled."""


class DeadlinePassed(CallEnded):
    pass


class CallCanceled(CallEnded):
    pass


class Budget:
    """The call's deadline on the monotonic clock, and its cancel event."""

    def __init__(self, seconds: float, cancel_event: threading.Event) -> None:
        self.started = time.monotonic()
        self.deadline = self.started + seconds
        self.cancel_event = cancel_event

    def next_wait(self) -> float:
        """Seconds the next wait may block; raises once the call must end."""
        if self.cancel_event.is_set():
            raise CallCanceled
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DeadlinePassed
        return min(left, POLL_SECONDS)

    def elapsed(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True)
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body_head: bytes  # the first bytes of the body, as many as the caller asked to keep


def request(
    *,
    scheme: str,
    host: str,
    port: int,
    address: str,
    method: str,
    target: str,
    body: bytes,
    headers: dict[str, str],
    budget: Budget,
    keep_body: int,
) -> Answer:
    """Send one request to `address` (the checked one: Host header and TLS name stay `host`) and read the whole
    answer, body included, within `budget`. Raises CallEnded, OSError (refused, reset, TLS) or http.client's
    HTTPException (a status line or headers malformed, a body cut short)."""
    connection = _Connection(host, port, address=address, tls=scheme == "https", budget=budget)
    response = None
    try:
        connection.request(method, target, body=body, headers={**headers, "Connection": "close"})
        response = connection.getresponse()
        if connection.guarded is not None and connection.guarded.eof:
            # http.client takes the end of the stream for the end of the headers: an answer cut mid-headers
            # would read as complete. A whole head ends with its blank line, before any end of stream.
            raise http.client.IncompleteRead(b"", None)
        return Answer(response.status, response.headers, _read_body(response, keep_body))
    finally:
        # With "Connection: close" http.client hands the socket to the response: both are closed here.
        if response is not None:
            response.close()
        connection.close()


def _read_body(response: http.client.HTTPResponse, keep: int) -> bytes:
    """The body to its end (or MAX_BODY_BYTES), keeping its first `keep` bytes. A body shorter than its
    Content-Length raises IncompleteRead (http.client itself does so for a chunked body cut short)."""
    kept = bytearray()
    total = 0
    while total < MAX_BODY_BYTES:
        chunk = response.read(min(64 * 1024, MAX_BODY_BYTES - total))
        if not chunk:
            if response.length:  # http.client returns short reads of a Content-Length body without a word
                raise http.client.IncompleteRead(bytes(kept), response.length)
            break
        total += len(chunk)
        if len(kept) < keep:
            kept += chunk[: keep - len(kept)]
    return bytes(kept)


class _Connection(http.client.HTTPConnection):
    """http.client's request writing and answer parsing over a socket whose every wait honours the budget."""

    def __init__(self, host: str, port: int, *, address: str, tls: bool, budget: Budget) -> None:
        super().__init__(host, port)
        self.address = address
        self.tls = tls
        self.budget = budget
        self.guarded: _GuardedSocket | None = None
        if tls:
            self.default_port = 443  # the Host header names the port only when it is not the scheme's

    def connect(self) -> None:
        sock = _connect(self.address, self.port, self.budget)
        try:
            if self.tls:
                # The certificate is checked against the URL's host name, not the address connected to.
                sock = ssl.create_default_context().wrap_socket(
                    sock, server_hostname=self.host, do_handshake_on_connect=False
                )
                _handshake(sock, self.budget)
        except BaseException:
            sock.close()
            raise
        self.sock = self.guarded = _GuardedSocket(sock, self.budget)


def _connect(address: str, port: int, budget: Budget) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        code = sock.connect_ex((address, port))
        if code in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
            _wait(sock, budget, write=True)
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            raise OSError(code, f"connect to {address}:{port}: {errno.errorcode.get(code, code)}")
    except BaseException:
        sock.close()
        raise
    return sock


def _handshake(sock: ssl.SSLSocket, budget: Budget) -> None:
    while True:
        try:
            sock.do_handshake()
            return
        except ssl.SSLWantReadError:
            _wait(sock, budget, write=False)
        except ssl.SSLWantWriteError:
            _wait(sock, budget, write=True)


def _wait(sock: socket.socket, budget: Budget, *, write: bool) -> None:
    """Block until the socket is ready, in slices, each after asking the budget (which raises when the call ends)."""
    poller = select.poll()  # not select.select: a worker's descriptors may number above FD_SETSIZE
    poller.register(sock.fileno(), select.POLLOUT if write else select.POLLIN)
    while not poller.poll(budget.next_wait() * 1000):
        pass


class _GuardedSocket:
    """What http.client uses of a socket (sendall, makefile, close) over a non-blocking one. As with a real socket's
    makefile, the descriptor stays open until the connection and every reader made from it are closed: http.client
    closes the connection as soon as it has parsed an answer that will close it, and reads the body afterwards."""

    def __init__(self, sock: socket.socket, budget: Budget) -> None:
        self._sock = sock
        self._budget = budget
        self._readers = 0
        self._closed = False
        self.eof = False  # the peer closed its end of the stream (read as 0 bytes)

    def sendall(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        while view:
            try:
                sent = self._sock.send(view)
            except (BlockingIOError, ssl.SSLWantWriteError):
                _wait(self._sock, self._budget, write=True)
                continue
            except ssl.SSLWantReadError:
                _wait(self._sock, self._budget, write=False)
                continue
            # A TLS write that had to wait is retried with the same buffer, as OpenSSL requires: only a
            # returned count moves on.
            view = view[sent:]

    def recv_into(self, buffer: Any) -> int:
        while True:
            try:
                count = self._sock.recv_into(buffer)
                self.eof = self.eof or (count == 0 and len(buffer) > 0)
                return count
            except (BlockingIOError, ssl.SSLWantReadError):
                _wait(self._sock, self._budget, write=False)
            except ssl.SSLWantWriteError:
                _wait(self._sock, self._budget, write=True)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        self._readers += 1
        return io.BufferedReader(_GuardedReader(self))

    def close(self) -> None:
        self._closed = True
        if not self._readers:
            self._sock.close()

    def reader_closed(self) -> None:
        self._readers -= 1
        if self._closed and not self._readers:
            self._sock.close()


class _GuardedReader(io.RawIOBase):
    def __init__(self, sock: _GuardedSocket) -> None:
        super().__init__()
        self._guarded = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._guarded.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._guarded.reader_closed()
        super().close()
