"""A raw TCP receiver that answers HTTP requests as slowly, or as brokenly, as a test scripts it: one header line a
second, a body one byte at a time, a connection cut mid-answer. It records, per connection, how much of the answer
it had sent when the caller hung up, so a test can tell a call that ended at its deadline from one that waited."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

# A script answers one connection: it writes with `send` (False once the caller has hung up) and returns whether it
# sent its whole answer.
Script = Callable[["Exchange"], bool]


@dataclass
class Exchange:
    """One connection: what the caller sent, what was answered, and whether the caller hung up first."""

    conn: socket.socket
    stop: threading.Event  # set when the test ends: every drip stops
    request: bytes = b""
    sent_steps: int = 0
    hung_up: bool = False
    answered: bool = False  # the whole answer was sent
    opened_at: float = field(default_factory=time.monotonic)
    closed_at: float | None = None
    progress: threading.Event = field(default_factory=threading.Event)

    def send(self, data: bytes) -> bool:
        """Write one step of the answer; False (and nothing written) once the caller has gone."""
        if self.hung_up:
            return False
        try:
            self.conn.sendall(data)
        except OSError:
            self.hung_up = True
            return False
        self.sent_steps += 1
        self.progress.set()
        return True

    def drip(self, steps: list[bytes], every: float) -> bool:
        """Each step `every` seconds; False as soon as the caller hangs up (or the test ends)."""
        return all(not self.stop.wait(every) and self.send(step) and not self._caller_gone() for step in steps)

    def _caller_gone(self) -> bool:
        """A caller that closed its end shows as a readable socket with nothing to read."""
        try:
            self.conn.setblocking(False)
            try:
                gone = self.conn.recv(1, socket.MSG_PEEK) == b""
            finally:
                self.conn.setblocking(True)
        except BlockingIOError:
            return False
        except OSError:
            gone = True
        if gone:
            self.hung_up = True
        return gone


class SlowTarget:
    """Listens on 127.0.0.1; each connection reads the request, then runs `script` on it in a thread of its own."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.exchanges: list[Exchange] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(128)
        self.server.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/hook"
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            exchange = Exchange(conn, self.stop)
            with self._lock:
                self.exchanges.append(exchange)
            threading.Thread(target=self._serve, args=(exchange,), daemon=True).start()

    def _serve(self, exchange: Exchange) -> None:
        try:
            exchange.request = _read_request(exchange.conn)
            exchange.answered = self.script(exchange)
            if exchange.answered:
                # Leave the close to the caller (as a keep-alive server would), within reason.
                exchange.conn.settimeout(5)
                while not self.stop.is_set() and exchange.conn.recv(4096):
                    pass
        except OSError:
            exchange.hung_up = True
        finally:
            exchange.closed_at = time.monotonic()
            exchange.conn.close()

    def close(self) -> None:
        self.stop.set()
        self.server.close()
        self.thread.join(timeout=5)


def _read_request(conn: socket.socket) -> bytes:
    """The request head and its Content-Length body."""
    conn.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    conn.settimeout(None)
    return head + b"\r\n\r\n" + body


def header_drip(lines: int, every: float) -> Script:
    """A 200 whose headers come one line every `every` seconds, `lines` of them, then the end of a 2-byte answer:
    a whole, successful answer only for a caller that waits for all of it."""

    def script(exchange: Exchange) -> bool:
        steps = [f"X-Drip-{n}: {n}\r\n".encode() for n in range(lines)]
        return (
            exchange.send(b"HTTP/1.1 200 OK\r\n")
            and exchange.drip(steps, every)
            and exchange.send(b"Content-Length: 2\r\n\r\nok")
        )

    return script


def slow_target(script: Script) -> Iterator[SlowTarget]:
    """For a fixture: a running target, closed (every dripping connection stopped) at the end."""
    target = SlowTarget(script)
    try:
        yield target
    finally:
        target.close()
