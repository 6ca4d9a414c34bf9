"""KafkaAdmin.create_topic returns once the metadata shows every partition it created (a
metadata request right after CreateTopics can still miss a new topic: a CI run's
test_create_topic_creates_the_requested_partitions read "does not exist"), and a topic that never
shows is a typed error naming the wait, within the settings' timeout. A fake AdminClient: the
real broker's side is tests/integration/test_table_api.py (Apache Kafka and Tansu)."""

from __future__ import annotations

import time
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest

import statesnap.kafka.admin as admin_module
from statesnap.errors import KafkaError
from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.config import KafkaSettings


class FakeAdmin:
    """CreateTopics succeeds at once; the topic shows in the metadata after *hidden* lookups,
    without a leader (an error on the topic) for *leaderless* more."""

    def __init__(self, hidden: int, leaderless: int = 0) -> None:
        self.hidden = hidden
        self.leaderless = leaderless
        self.created: dict[str, int] = {}
        self.lookups = 0
        self.timeouts: list[float] = []

    def create_topics(self, topics: list[Any], request_timeout: float) -> dict[str, Future[None]]:
        del request_timeout
        done: Future[None] = Future()
        done.set_result(None)
        for t in topics:
            self.created[t.topic] = t.num_partitions
        return {t.topic: done for t in topics}

    def list_topics(self, timeout: float) -> Any:
        self.timeouts.append(timeout)
        self.lookups += 1
        shown = {} if self.lookups <= self.hidden else self.created
        error = None
        if self.hidden < self.lookups <= self.hidden + self.leaderless:
            error = SimpleNamespace(str=lambda: "Broker: Leader not available")
        topics = {
            name: SimpleNamespace(partitions=dict.fromkeys(range(n)), error=error)
            for name, n in shown.items()
        }
        return SimpleNamespace(topics=topics)

    def poll(self, timeout: float) -> int:
        return 0


def admin_with(fake: FakeAdmin, monkeypatch: pytest.MonkeyPatch, timeout: float) -> KafkaAdmin:
    monkeypatch.setattr(admin_module, "new_watched_admin", lambda settings: (fake, []))
    return KafkaAdmin(KafkaSettings("127.0.0.1:1", timeout=timeout))


def test_create_topic_returns_once_its_partitions_show(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeAdmin(hidden=3, leaderless=2)  # the existence check, two misses, two leaderless
    admin = admin_with(fake, monkeypatch, timeout=5)
    assert admin.create_topic("t", 3) is True
    assert fake.lookups == 6
    assert admin.partitions("t") == (0, 1, 2)


def test_a_created_topic_that_never_shows_is_a_typed_error_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeAdmin(hidden=10**9)
    admin = admin_with(fake, monkeypatch, timeout=0.3)
    started = time.monotonic()
    with pytest.raises(
        KafkaError,
        match=r"topic 't' was created, but 127\.0\.0\.1:1 did not show its 3 partitions within 0\.3 s",
    ):
        admin.create_topic("t", 3)
    assert time.monotonic() - started < 2
    # Each lookup of the wait has what is left of it, not the whole timeout again.
    waits = fake.timeouts[1:]
    assert waits == sorted(waits, reverse=True)
    assert waits[0] <= 0.3
    assert waits[-1] < 0.1
