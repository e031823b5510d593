"""The handlers' cancel event: a threading.Event that makes its condition only when a thread waits on it."""

from __future__ import annotations

import threading
import time

from dispatch.cancel import CancelEvent


def test_it_is_a_threading_event_and_unset_at_first():
    event = CancelEvent()
    assert isinstance(event, threading.Event)
    assert not event.is_set()
    assert event.wait(0.01) is False


def test_a_set_before_the_wait_returns_at_once():
    event = CancelEvent()
    event.set()
    started = time.monotonic()
    assert event.wait(5) is True
    assert time.monotonic() - started < 1


def test_a_set_from_another_thread_wakes_a_waiter():
    event = CancelEvent()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(event.wait(10)))
    waiter.start()
    time.sleep(0.05)  # the waiter is inside wait(), on the condition made for it
    started = time.monotonic()
    event.set()
    waiter.join(5)
    assert woke == [True]
    assert time.monotonic() - started < 1


def test_many_waiters_and_a_racing_set_all_wake():
    for _ in range(50):
        event = CancelEvent()
        woke: list[bool] = []
        waiters = [threading.Thread(target=lambda e=event, w=woke: w.append(e.wait(5))) for _ in range(4)]
        for waiter in waiters:
            waiter.start()
        event.set()
        for waiter in waiters:
            waiter.join(6)
        assert woke == [True] * 4


def test_clear_unsets_it():
    event = CancelEvent()
    event.set()
    event.wait(0)
    event.clear()
    assert not event.is_set()
    assert event.wait(0.01) is False
