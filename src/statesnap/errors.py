"""The exception hierarchy: every error statesnap raises derives from :class:`StatesnapError`.

Each class says when it is raised and what an operator should do about it. Third-party errors
(confluent-kafka, botocore, OS errors) are translated at the boundary with ``raise ... from e``.
"""

from __future__ import annotations

__all__ = [
    "BlobExistsError",
    "BlobNotFoundError",
    "BlobStoreError",
    "BrokerUnavailableError",
    "CatchUpStoppedError",
    "CheckpointConflictError",
    "CheckpointError",
    "CheckpointHistoryLostError",
    "CheckpointMismatchError",
    "CheckpointTimeoutError",
    "ClassArchiveError",
    "ConfigError",
    "CorruptCheckpointError",
    "DataLossError",
    "DeserializationError",
    "EngineOptionError",
    "FatalClientError",
    "GenerationConflictError",
    "GenerationNotFoundError",
    "HandlerError",
    "InvalidBlobKeyError",
    "InvalidDurationError",
    "InvalidStoreUrlError",
    "KafkaConfigError",
    "KafkaError",
    "LogTruncatedError",
    "MigrationError",
    "MissingBucketError",
    "NoUsableCheckpointError",
    "OffsetOutOfRangeError",
    "OutputError",
    "PartitionNotOwnedError",
    "ReadOnlyTableError",
    "RecordsDeletedError",
    "SchemaRegistryError",
    "SerdeError",
    "SerializationError",
    "SnapshotError",
    "SnapshotNotFoundError",
    "SnapshotStoreError",
    "StaleGenerationError",
    "StateVersionError",
    "StatesnapError",
    "StoreAccessError",
    "StoreNotWritableError",
    "TableError",
    "TableNotFoundError",
    "TableStateError",
    "TopicNotFoundError",
    "UndecodableRowError",
    "UnknownSchemeError",
]


class StatesnapError(Exception):
    """Root of all statesnap errors; catch this to handle any of them."""


class ConfigError(StatesnapError, ValueError):
    """A setting is malformed: an unparsable duration, an unknown store kind, a bad option.

    Fix the named setting; nothing was read or written.
    """


class InvalidDurationError(ConfigError):
    """A duration such as ``--min-age`` is negative or not of the form ``90s``, ``5m``, ``1h``, ``2d``."""


# --- blob stores --------------------------------------------------------------------------------


class BlobStoreError(StatesnapError):
    """A blob store could not be reached or used."""


class UnknownSchemeError(BlobStoreError, ConfigError):
    """A checkpoint URL names a scheme no blob store handles (supported: file://, s3://)."""


class MissingBucketError(BlobStoreError):
    """The S3 bucket in a checkpoint URL does not exist or is not visible with these credentials."""


class StoreNotWritableError(BlobStoreError):
    """The checkpoint location cannot be written (permissions, read-only filesystem, not a dir)."""


class BlobNotFoundError(BlobStoreError, FileNotFoundError):
    """An object that should exist is missing (deleted by GC or by hand)."""


class BlobExistsError(BlobStoreError, FileExistsError):
    """A write-once object already exists: another writer committed it first."""


# --- Kafka --------------------------------------------------------------------------------------


class KafkaError(StatesnapError):
    """Talking to the Kafka cluster failed."""


class OutputError(KafkaError):
    """A processor's emitted records could not be delivered (the commit point, and so the
    checkpoint that would claim their inputs, did not happen)."""


class BrokerUnavailableError(KafkaError):
    """No broker answered within the timeout; check the bootstrap address and the network."""


class TopicNotFoundError(KafkaError):
    """The topic does not exist on the cluster; create it or fix the name."""


class FatalClientError(KafkaError):
    """librdkafka declared a Kafka client fatal: a static group member fenced by another consumer
    with the same ``group.instance.id``, a transactional producer fenced by a newer instance of its
    ``transactional.id``, an idempotent producer that lost its sequence. Raised by every task
    whose client it hits (see :mod:`statesnap.kafka.fatal`); such a client never consumes or
    delivers again, so the task stops instead of idling while it looks alive: a table's reads and
    ``raise_if_failed()`` raise it, ``statesnap run``/``materialize`` exit non-zero.

    Fix the cause the message names (give every instance its own ``group.instance.id``, stop the
    other instance), then restart: the task restores from its last checkpoint. ``cause`` holds
    librdkafka's own words."""

    def __init__(self, message: str, *, cause: str = "") -> None:
        super().__init__(message)
        self.cause = cause


# --- checkpoints --------------------------------------------------------------------------------


class CheckpointError(StatesnapError):
    """A checkpoint could not be written or read."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint fails verification (unreadable manifest, missing file, checksum mismatch,
    unknown format version). Restores skip it and use the next-older one; ``verify`` reports it."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint under this table name was written for another topic or cluster.

    Restoring it would produce a wrong table, so statesnap refuses; pick another table name or
    checkpoint location. Nothing is deleted.
    """


class StateVersionError(CheckpointMismatchError):
    """A checkpoint holds rows of another state version than the code restoring it, and no
    migration brings them to it.

    Mixing formats would corrupt the state, so statesnap refuses; register the migrations the
    message names, run the code of that version, or start from a generation of this version.
    """


class MigrationError(ConfigError):
    """A migration returned what cannot be stored: not bytes, not a (key, value) pair, or a key
    moved out of the partition that owns it (a table's reads and its consumer find a key in the
    partition the producers' partitioner puts it in). Fix the migration; nothing was written.
    """


class CheckpointConflictError(CheckpointError, BlobExistsError):
    """Another writer committed this generation first; re-read the newest checkpoint and retry."""


class CheckpointHistoryLostError(CheckpointError):
    """The checkpoint a running writer builds on vanished from the store (the store was wiped,
    restored from an older copy, or its snapshot deleted). A Python table recovers by writing a
    complete checkpoint; a Spark materializer, whose state lives in those files, stops with this
    error: restart it to rebuild from the newest checkpoint left (or the topic)."""


class CheckpointTimeoutError(CheckpointError, TimeoutError):
    """A checkpoint (or a shutdown waiting for one) did not finish within its deadline: the
    checkpoint store did not answer. The previous checkpoint stands; the unfinished one's files
    are debris that GC removes."""


class NoUsableCheckpointError(CheckpointError):
    """``require_checkpoint=True`` was asked for but no checkpoint verifies."""


# --- tables -------------------------------------------------------------------------------------


class TableError(StatesnapError):
    """A table was used in a way its state does not allow."""


class ReadOnlyTableError(TableError):
    """A write was attempted through a read-only table (a follower); followers never write."""


class CatchUpStoppedError(TableError):
    """A start was asked to stop while it caught up (:meth:`statesnap.Table.stop_catching_up`, the
    CLI's Ctrl-C): it stopped between two batches and checkpointed what it had read, so a restart
    resumes from there instead of from the last periodic checkpoint (an hour old, by default).

    ``checkpoint`` is the generation written (None: no checkpoint store, a read-only task, or a
    task that shares a snapshot with peers that had not reported), ``records`` the records read."""

    def __init__(self, name: str, records: int, checkpoint: int | None) -> None:
        kept = (
            f"checkpoint {checkpoint} holds what was read; run again to resume from it"
            if checkpoint is not None
            else "no checkpoint was written; a restart resumes from the last committed one"
        )
        super().__init__(f"{name}: stopped while catching up after {records:,} records: {kept}")
        self.name = name
        self.records = records
        self.checkpoint = checkpoint


class TableStateError(TableError):
    """A method was called in the wrong lifecycle state (e.g. ``get`` before ``start``)."""

    def __init__(self, action: str, state: str, expected: str) -> None:
        super().__init__(f"cannot {action}: table is {state}, expected {expected}")
        self.action = action
        self.state = state
        self.expected = expected


class StoreAccessError(TableError):
    """A processor's store was written outside a handler (or punctuator) call: state must change
    only as records are processed, or a restore and a full re-processing would disagree."""


class HandlerError(StatesnapError):
    """A processor's handler raised on a record and no dead-letter topic was configured; the
    record's topic, partition and offset are in the message. The processor stops there: its last
    checkpoint stands and a restart re-processes from it."""

    def __init__(self, message: str, *, topic: str, partition: int, offset: int) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.offset = offset


# --- snapshots ----------------------------------------------------------------------------------


class SnapshotError(StatesnapError):
    """A snapshot operation failed."""


class SnapshotNotFoundError(SnapshotError):
    """No snapshot has this generation (never created, or deleted)."""


class StaleGenerationError(SnapshotError):
    """A report or update names a generation other than the current ``CREATED`` one: it is fenced.

    The task should ask ``target_generation()`` again and report for that one.
    """


class GenerationConflictError(SnapshotError):
    """An update would move the generation backwards or lost a race too many times; nothing was
    written. Retry against the current snapshot."""


# --- shared additions (one system, two engines) --------------------------------------------------


class TableNotFoundError(CheckpointError):
    """No table of this name exists under the checkpoint root (no descriptor, no manifest).

    Check the URL and ``--table``; a table appears once a writer has started over the store.
    """


class ClassArchiveError(StatesnapError):
    """The Spark driver's class archive could not be made (``statesnap.spark.class_archive``);
    Spark starts without it."""


class EngineOptionError(ConfigError):
    """An option was given to an engine that cannot honour it (e.g. ``--store rocksdb`` on Spark).

    The message names the option and the engine that can; nothing was read or written.
    """


class SnapshotStoreError(SnapshotError, ConfigError):
    """The snapshot store spec is malformed or does not match the one the table was created with."""


# --- serdes (keys and values as objects) ---------------------------------------------------------


class SerdeError(StatesnapError):
    """A key or value could not be converted between stored bytes and objects by the table's serde,
    or the schema registry a serde needs could not be used. The cause is chained."""


class DeserializationError(SerdeError, ValueError):
    """Stored bytes cannot be decoded by the serde (not JSON, not UTF-8, not schema-registry framed,
    a schema id the registry does not know, bytes that do not match the writer's schema).

    The table's bytes are unchanged: fix the serde (or the producer) and read again.
    """


class SerializationError(SerdeError, ValueError):
    """An object cannot be encoded by the serde (e.g. it does not match the schema, or the subject
    has no schema to write with). Nothing was written."""


class SchemaRegistryError(SerdeError):
    """The schema registry refused a request or could not be reached (address, credentials, subject,
    compatibility). The message names the registry URL without credentials."""


# --- faults at the edges (Kafka, blob URLs and keys) ---------------------------------------------


class KafkaConfigError(ConfigError):
    """librdkafka refused a client setting: an unknown property, an invalid value, SASL without
    credentials. The message names the property (never a secret value); fix it in
    ``kafka_config`` / ``--kafka-config`` / the properties file / ``STATESNAP_KAFKA_*``."""

    def __init__(self, message: str, prop: str | None = None) -> None:
        super().__init__(message)
        self.property = prop


class OffsetOutOfRangeError(KafkaError):
    """A partition's next offset lies beyond its log end: the offsets (usually a checkpoint's)
    belong to another incarnation of the topic (deleted and recreated, or another cluster).

    Continuing would wait forever or build a wrong table; refuse that checkpoint and restore an
    older one or replay from the beginning.
    """

    def __init__(self, topic: str, partition: int, offset: int, log_end: int | None, address: str) -> None:
        end = "unknown" if log_end is None else str(log_end)
        super().__init__(
            f"topic {topic!r} partition {partition} on {address}: next offset {offset} is beyond "
            f"the log end {end}; the offsets belong to another incarnation of the topic"
        )
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.log_end = log_end


class LogTruncatedError(OffsetOutOfRangeError):
    """The partition's log was truncated below a position (an unclean leader election or a
    broker's recovery; KIP-320 leader epochs tell): records read before it are gone and later
    records took their offsets. Handled as any offset the log no longer leads to: that checkpoint
    is dropped for an older one, or the topic replayed."""

    def __init__(
        self, topic: str, partition: int, offset: int, log_end: int | None, address: str, held: str
    ) -> None:
        super().__init__(topic, partition, offset, log_end, address)
        self.args = (
            f"topic {topic!r} partition {partition} on {address}: the log was truncated below next "
            f"offset {offset} ({held}): an unclean leader election or broker restart lost records read "
            "before it and later records took their offsets; continuing would skip or repeat records",
        )


class RecordsDeletedError(OffsetOutOfRangeError):
    """Retention deleted records a restore still had to read: the checkpoint it continues (its
    next offset, or where the restore had got to) now lies below the partition's log start.

    An :class:`OffsetOutOfRangeError`, so a restore handles it the same way: drop that checkpoint
    and replay what the log holds, or fail when a checkpoint was required.
    """

    def __init__(self, topic: str, partition: int, offset: int, log_start: int, address: str) -> None:
        KafkaError.__init__(
            self,
            f"topic {topic!r} partition {partition} on {address}: retention deleted offsets "
            f"{offset}..{log_start - 1} (the log now starts at {log_start}) before the restore read "
            "them; the checkpoint cannot be continued without a hole",
        )
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.log_end = None
        self.log_start = log_start


class InvalidStoreUrlError(BlobStoreError, ConfigError):
    """A checkpoint URL or path is malformed (an empty scheme, a NUL byte, a host in a file URL).

    The message shows the URL with credentials masked; fix it, nothing was read or written."""


class InvalidBlobKeyError(BlobStoreError, ValueError):
    """A key would leave the store's root (``..``, an absolute path) or is not a valid name.

    Keys come from statesnap's own layout and from manifests; a manifest naming such a key is
    corrupt (or hostile) and is refused instead of read."""


class DataLossError(KafkaError):
    """A Spark read over Kafka would miss records (``failOnDataLoss=true``, Spark's default):
    offsets below a partition's log start (deleted by retention), a partition or topic that is
    gone, or offsets beyond a partition's end (the topic was deleted and recreated).

    Restart the query from a new checkpoint location or ``startingOffsets``, or set
    ``failOnDataLoss=false`` to warn and continue from the earliest available offsets."""


# --- table reads (typed mapping, point in time) --------------------------------------------------


class UndecodableRowError(DeserializationError):
    """A stored key or value cannot be decoded by the table's serde; the message names the table,
    the key (as bytes), and the partition and offset of the record that wrote it (never the value).

    Fix the serde or the producer; the table's bytes are unchanged (``raw_items()`` still reads
    them). The serde's own error is chained as ``__cause__``."""

    def __init__(
        self, message: str, *, table: str, key: bytes, partition: int | None, offset: int | None
    ) -> None:
        super().__init__(message)
        self.table = table
        self.key = key
        self.partition = partition
        self.offset = offset


class GenerationNotFoundError(NoUsableCheckpointError, SnapshotNotFoundError):
    """A table was asked for a checkpoint generation the store does not hold (never written, or
    deleted by GC). The message says ``no generation G`` and lists the generations there are."""


class PartitionNotOwnedError(TableError):
    """A read named a key of a partition this member of a consumer group does not serve: another
    member owns it, or it was gained in a rebalance and is still being restored (``restoring``).

    Route the read to the owner (``Table.partition_for(key)`` says which partition; the group's
    members know who owns it), or retry once the rebalance has settled."""

    def __init__(self, message: str, *, table: str, partition: int, restoring: bool) -> None:
        super().__init__(message)
        self.table = table
        self.partition = partition
        self.restoring = restoring
