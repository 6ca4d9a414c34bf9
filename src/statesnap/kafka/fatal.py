"""Which Kafka client errors stop a task, decided in one place.

librdkafka says a client is done for in more than one way. A fatal error's ``KafkaError`` has
``fatal()`` True where librdkafka builds it so (a transactional producer's call, a fatal delivery
report), but the error it hands ``error_cb`` — and the consumer's own error events — carry the code
``_FATAL`` with ``fatal()`` False: a static group member fenced by another consumer with the same
``group.instance.id`` is reported only that way (librdkafka 2.x on Apache Kafka 4.x, measured).
Past either, the client never works again: a consumer gets no partitions and no records, a
producer delivers nothing. A member fenced under its ``group.instance.id`` (``FENCED_INSTANCE_ID``)
is out of the group for good too. Every statesnap error callback and poll loop asks
:func:`is_fatal` and fails its task with :class:`~statesnap.errors.FatalClientError` (never a
warning and an idle loop that looks alive).

Not fatal: ``UNKNOWN_MEMBER_ID`` and KIP-848's ``FENCED_MEMBER_EPOCH`` (librdkafka rejoins the group
under a new member id, and the rebalance callbacks hand the partitions over), a lost cluster
(librdkafka reconnects; readers judge a silent cluster themselves), a producer fenced where fencing
is how writers take turns (the snapshot store's topic, :mod:`statesnap.snapshot.topic_clients`).

``error_cb`` runs on the thread that calls ``consume()``/``poll()``/``flush()``, inside that call:
:class:`FatalErrors` records the error there and the caller raises it once the call returns
(an exception raised inside a librdkafka callback surfaces unreliably).
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from confluent_kafka import KafkaError as RdKafkaError

from statesnap.errors import FatalClientError

__all__ = ["FENCED_CODES", "FatalErrors", "FatalLogLines", "fatal_error", "is_fatal"]

#: librdkafka's "see rd_kafka_fatal_error()" code, as error_cb and error events carry it.
_FATAL = int(RdKafkaError._FATAL)
#: A static member fenced by another consumer with the same ``group.instance.id``.
_FENCED_INSTANCE = int(RdKafkaError.FENCED_INSTANCE_ID)
#: A transactional producer fenced by a newer instance of its ``transactional.id``.
FENCED_CODES = frozenset(
    {int(RdKafkaError._FENCED), int(RdKafkaError.PRODUCER_FENCED), int(RdKafkaError.INVALID_PRODUCER_EPOCH)}
)


def is_fatal(err: Any) -> bool:
    """Whether *err* (a confluent-kafka ``KafkaError``, or None) means the client that reported
    it is done for: librdkafka's fatal flag, its ``_FATAL`` code, or a member fenced under its
    ``group.instance.id``."""
    if err is None:
        return False
    try:
        if err.fatal():
            return True
        code = int(err.code())
    except (AttributeError, TypeError, ValueError):
        return False
    return code in (_FATAL, _FENCED_INSTANCE)


#: librdkafka's fatal consumer error says its cause twice: ``Fatal error: X: Fatal consumer error: X``.
_TWICE = re.compile(r"^Fatal error: (?P<cause>.+): Fatal [a-z ]*error: (?P=cause)$")


def _cause_of(err: Any) -> str:
    try:
        text = str(err.str())
    except AttributeError:
        return str(err)
    m = _TWICE.match(text)
    return m["cause"] if m else text


def _advice(cause: str, code: int | None) -> str:
    """What the operator does about it, from what librdkafka said."""
    text = cause.lower()
    if code == _FENCED_INSTANCE or "group.instance.id" in text:
        return "another member of the group runs with the same group.instance.id: give each its own"
    if code in FENCED_CODES or "fenced" in text:
        return "a newer instance of this task took over: stop the other instance"
    return "the client cannot recover: fix the cause, then restart (the task restores from its checkpoint)"


def fatal_error(err: Any, what: str, address: str) -> FatalClientError:
    """The one-line error that stops a task: *what* the client was doing (``consuming 'orders' in
    group 'g'``), on which cluster, librdkafka's own words, and what to do."""
    cause = _cause_of(err)
    try:
        code: int | None = int(err.code())
    except (AttributeError, TypeError, ValueError):
        code = None
    return FatalClientError(
        f"fatal Kafka client error {what} at {address}: {cause}; {_advice(cause, code)}",
        cause=cause,
    )


class FatalErrors:
    """The first fatal error a client's ``error_cb`` reported, raised by its poll loop.

    :meth:`note` is called from ``error_cb`` (on the polling thread, inside the poll call) and says
    whether the error was fatal; :meth:`raise_if_any` is called after the call returns. The lock is
    for a caller on another thread asking :attr:`error`."""

    def __init__(self, what: str, address: str) -> None:
        self.what = what
        self.address = address
        self._lock = threading.Lock()
        self._error: FatalClientError | None = None

    def note(self, err: Any) -> bool:
        """Record *err* if it is fatal (the first one wins); True if it was."""
        if not is_fatal(err):
            return False
        with self._lock:
            if self._error is None:
                self._error = fatal_error(err, self.what, self.address)
        return True

    @property
    def error(self) -> FatalClientError | None:
        with self._lock:
            return self._error

    def raise_if_any(self) -> None:
        """Raise the fatal error recorded so far, if any."""
        error = self.error
        if error is not None:
            raise error


#: librdkafka's log facilities of a fatal error (``FATAL``) and of a transactional producer's
#: fatal or abortable error (``TXNERR``): each is also returned by the call that failed.
_FATAL_FACILITIES = frozenset({"FATAL", "TXNERR"})


class FatalLogLines:
    """A librdkafka ``logger`` that sends its ``FATAL`` and ``TXNERR`` lines to DEBUG: the error
    they announce stops the task as a typed error carrying the same words (a
    :class:`FatalClientError`, or the exactly-once outputs' :class:`~statesnap.errors.OutputError`),
    said once by whoever reports the failure (librdkafka logs them at its highest levels, which
    pass every filter). Every other line reaches *target* as it was."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def log(self, level: int, msg: str, *args: Any) -> None:
        if level > logging.DEBUG and args and args[0] in _FATAL_FACILITIES:
            level = logging.DEBUG
        self.target.log(level, msg, *args)

    @classmethod
    def around(cls, conf: dict[str, Any]) -> dict[str, Any]:
        """The ``logger`` override for a client built from *conf* (its own logger wrapped)."""
        target = conf.get("logger")
        return {"logger": cls(target if target is not None else logging.getLogger("statesnap.librdkafka"))}
