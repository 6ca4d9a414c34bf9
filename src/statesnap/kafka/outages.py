"""Saying which brokers are down: one broker of several is not the cluster.

librdkafka reports a connection that failed (``_TRANSPORT``, ``_RESOLVE``) per broker, naming it
(``127.0.0.1:9093/2: Connect to ipv4#127.0.0.1:9093 failed: Connection refused``), and
``_ALL_BROKERS_DOWN`` (``3/3 brokers are down``) only when no broker is connected at all. A reader
told of one broker must not call the cluster unreachable while the others serve it: it asks the
cluster (a metadata request, answered by any broker up) and says which brokers are down and that
the others answer, or that none does.

:class:`BrokerOutages` keeps what ``error_cb`` said (on the polling thread, inside the poll call);
its owner calls :meth:`BrokerOutages.report` from its poll loop, outside the callback.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import KafkaException

__all__ = ["BROKER_DOWN", "BrokerOutages", "broker_of", "metadata_answers"]

#: Codes librdkafka gives one broker's failed connection.
BROKER_DOWN = frozenset({int(RdKafkaError._TRANSPORT), int(RdKafkaError._RESOLVE)})
_ALL_DOWN = int(RdKafkaError._ALL_BROKERS_DOWN)
#: ``[proto://]host:port/id: `` at the start of librdkafka's message about one broker.
_BROKER = re.compile(r"^(?:[a-z_]+://)?(?P<broker>[^\s/]+)/(?P<id>[^\s:]+): ")
#: A broker reported down is said again if it is still (or again) down this much later.
REPEAT_AFTER = 300.0
#: How long the check that the other brokers answer may take.
PROBE_TIMEOUT = 1.0
#: Broker → when it was last said to be down, by any client of this process: a table's readers
#: (its restore's and its group member's, a processor's inputs) say one broker down once.
_REPORTED: dict[str, float] = {}
_REPORTED_LOCK = threading.Lock()


def broker_of(text: str) -> str | None:
    """The ``host:port`` librdkafka's message is about, or None (a message about no one broker)."""
    m = _BROKER.match(text)
    return m["broker"] if m else None


def metadata_answers(client: Any) -> Callable[[float], bool]:
    """Whether any broker answers *client*'s metadata request within the timeout given (all
    topics: naming one has auto-creating brokers create it)."""

    def answers(timeout: float) -> bool:
        try:
            client.list_topics(timeout=timeout)
        except KafkaException:
            return False
        return True

    return answers


def _detail(text: str) -> str:
    text = _BROKER.sub("", text)
    return re.sub(r" \(after \d+ms in state [A-Z_]+(?:, \d+ identical error\(s\) suppressed)?\)$", "", text)


class BrokerOutages:
    """Brokers librdkafka said it cannot reach, until the owner has said so once."""

    def __init__(self, address: str, logger: logging.Logger, context: str) -> None:
        """*address*: the bootstrap list (named in the lines); *context*: what the owner does
        (``consuming 'orders'``), for the log lines."""
        self.address = address
        self.log = logger
        self.context = context
        #: Broker → librdkafka's reason, noted and not reported yet.
        self._pending: dict[str, str] = {}
        #: librdkafka's "N/N brokers are down", noted and not checked yet.
        self._all_down: str | None = None
        #: Brokers this instance said are down (forgotten when the whole cluster answers again).
        self._said: set[str] = set()

    def note(self, err: Any) -> bool:
        """From ``error_cb``: True if *err* was about brokers being down (kept for :meth:`report`).

        "All brokers are down" is kept for checking too: librdkafka also says it when the one
        broker it has tried so far failed, the others not tried yet (``1/1 brokers are down`` with
        a second bootstrap broker up, librdkafka 2.16, measured)."""
        code = int(err.code())
        text = str(err.str())
        if code == _ALL_DOWN:
            self._all_down = text
            return True
        if code not in BROKER_DOWN:
            return False
        broker = broker_of(text)
        if broker is None:
            return False
        self._pending[broker] = _detail(text)
        return True

    def report(self, others_answer: Callable[[float], bool]) -> str | None:
        """Check what :meth:`note` kept: if the cluster answers *others_answer* (a metadata
        request within the timeout it is given), say which brokers are down, once each (again
        after :data:`REPEAT_AFTER`), and that the others answer. Returns why the cluster is
        unreachable when it does not answer (the owner says so). Called by the owner's poll loop."""
        if not self._pending and self._all_down is None:
            return None
        now = time.monotonic()
        pending, self._pending = self._pending, {}
        all_down, self._all_down = self._all_down, None
        with _REPORTED_LOCK:
            due = {
                b: why for b, why in pending.items() if now - _REPORTED.get(b, -REPEAT_AFTER) >= REPEAT_AFTER
            }
        if not due and all_down is None:
            return None
        brokers = ", ".join(f"{b} ({why})" for b, why in sorted(due.items()))
        if not others_answer(PROBE_TIMEOUT):
            return "; ".join(part for part in (all_down, brokers) if part)
        with _REPORTED_LOCK:  # another client of the process may have said it meanwhile
            due = {b: why for b, why in due.items() if now - _REPORTED.get(b, -REPEAT_AFTER) >= REPEAT_AFTER}
            for broker in due:
                _REPORTED[broker] = now
        if not due:
            return None
        self._said.update(due)
        brokers = ", ".join(f"{b} ({why})" for b, why in sorted(due.items()))
        self.log.warning(
            "Kafka %s %s unreachable; the other brokers of %s answer (%s)",
            "broker" if len(due) == 1 else "brokers",
            brokers,
            self.address,
            self.context,
        )
        return None

    def discard(self) -> None:
        """Drop what was noted: the owner has said the whole cluster is down already."""
        self._pending.clear()
        self._all_down = None

    def forget(self) -> None:
        """The cluster answered again after being wholly unreachable: brokers down now are new news."""
        self._pending.clear()
        with _REPORTED_LOCK:
            for broker in self._said:
                _REPORTED.pop(broker, None)
        self._said.clear()
