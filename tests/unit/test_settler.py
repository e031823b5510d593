"""The settler's two classes (each in statements of its own, each batch sized by its own statements' duration), and its
thread (started again if it died, not once told to stop)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from dispatch.engine import settler as settler_module
from dispatch.engine.settler import SETTLE_TARGET_SECONDS, Settler
from tests.support import poll


@dataclass
class Stats:
    settled_envelopes: int = 0


@dataclass
class Statements:
    """Stands in for the settle statement: settles all it is asked for (`waiting` per class) and takes `seconds`."""

    waiting: dict[str, int]
    seconds: dict[str, float]
    calls: list[tuple[int, int]] = field(default_factory=list)
    clock: list[float] = field(default_factory=lambda: [0.0])
    kind: str = "small"

    async def execute(self, _sql: str, params: dict[str, Any], prepare: bool = False) -> Statements:
        self.calls.append((params["limit"], params["big_limit"]))
        kind = self.kind = "big" if params["big_limit"] else "small"
        self.settled = min(params["big_limit"] or params["limit"], self.waiting[kind])
        self.waiting[kind] -= self.settled
        self.clock[0] += self.seconds[kind]
        return self

    async def fetchone(self) -> tuple[int, list[float], int, float]:
        # The last column: how long the statement held its locks on the server (here, as long as it took).
        return (0, [1.0] * self.settled, 0, self.seconds[self.kind])


def settler_on(statements: Statements, monkeypatch, *, batch: int, big_batch: int) -> Settler:
    monkeypatch.setattr(settler_module.time, "monotonic", lambda: statements.clock[0])
    settler = Settler("relay-test", "", most=500, stats=Stats())
    settler.batch, settler.big_batch = batch, big_batch

    async def connect() -> Statements:
        return statements

    settler.connect = connect  # type: ignore[method-assign]
    return settler


def test_a_slow_statement_of_a_bursts_envelopes_halves_its_own_batch_and_not_the_steady_one(monkeypatch):
    slow, quick = SETTLE_TARGET_SECONDS * 3, SETTLE_TARGET_SECONDS / 4
    statements = Statements(waiting={"small": 40, "big": 1000}, seconds={"small": quick, "big": slow})
    settler = settler_on(statements, monkeypatch, batch=40, big_batch=64)
    assert asyncio.run(settler.settle()) == 40 + 64
    assert statements.calls == [(40, 0), (80, 0), (0, 64)], "one statement per class, never both in one"
    assert (settler.batch, settler.big_batch) == (80, 32), "the steady batch grew while the burst's is halved"
    assert settler.more_waiting


def test_the_steady_envelopes_are_settled_to_the_end_of_their_backlog_before_a_bursts_statement(monkeypatch):
    statements = Statements(waiting={"small": 100, "big": 1000}, seconds={"small": 0.01, "big": 0.01})
    settler = settler_on(statements, monkeypatch, batch=20, big_batch=8)
    assert asyncio.run(settler.settle()) == 100 + 8
    assert statements.calls == [(20, 0), (40, 0), (80, 0), (0, 8)], "the third small one came back short: then big"


def test_the_steady_envelopes_turn_ends_after_a_second_so_a_burst_still_settles(monkeypatch):
    turn = settler_module.SMALL_TURN_SECONDS
    statements = Statements(waiting={"small": 10_000, "big": 1000}, seconds={"small": turn / 2.5, "big": 0.01})
    settler = settler_on(statements, monkeypatch, batch=100, big_batch=8)
    asyncio.run(settler.settle())
    assert [call for call in statements.calls if call[1]] == [(0, 8)]
    assert len(statements.calls) == 3 + 1, "three full small statements fill the turn, then the burst's"
    assert settler.more_waiting


def test_with_no_big_envelope_found_the_next_look_for_one_waits(monkeypatch):
    statements = Statements(waiting={"small": 1000, "big": 0}, seconds={"small": 0.001, "big": 0.001})
    settler = settler_on(statements, monkeypatch, batch=10, big_batch=1)
    asyncio.run(settler.settle())
    asyncio.run(settler.settle())
    assert [call for call in statements.calls if call[1]] == [(0, 1)], "no second look within BIG_LOOK_SECONDS"
    statements.clock[0] += settler_module.BIG_LOOK_SECONDS
    statements.waiting["big"] = 5
    asyncio.run(settler.settle())
    assert statements.calls[-1] == (0, 1), "and once it passed, the burst's envelopes are found"


def test_a_stopping_relay_settles_every_class_to_the_end(monkeypatch):
    statements = Statements(waiting={"small": 3, "big": 0}, seconds={"small": 0.001, "big": 0.001})
    settler = settler_on(statements, monkeypatch, batch=2, big_batch=1)
    assert asyncio.run(settler.settle()) == 3  # every small one; no big one found: the next look would wait
    statements.waiting["big"] = 3
    assert asyncio.run(settler.settle_all()) == 3
    assert statements.waiting == {"small": 0, "big": 0}


def test_a_settler_thread_that_died_is_started_again_and_stops_when_told(monkeypatch):
    settler = Settler("relay-test", "", most=500, stats=Stats())
    runs: list[str] = []

    async def run(stop) -> None:
        runs.append(threading.current_thread().name)
        if len(runs) == 1:
            raise RuntimeError("an error run did not absorb")
        while not stop.is_set:
            await asyncio.sleep(0.01)

    settler.run = run  # type: ignore[method-assign]
    settler.start_thread()
    settler._thread.join(5)  # type: ignore[union-attr]
    assert not settler._thread.is_alive(), "the first run died"  # type: ignore[union-attr]

    settler.ensure_running()
    poll(lambda: len(runs) >= 2, 5, every=0.01)
    assert runs == ["settler", "settler"], "started again, on a thread of its own"
    assert settler._thread.is_alive()  # type: ignore[union-attr]

    settler.stop_thread(timeout=5)
    assert not settler._thread.is_alive()  # type: ignore[union-attr]
    settler.ensure_running()
    assert not settler._thread.is_alive(), "a settler told to stop is not started again"  # type: ignore[union-attr]
