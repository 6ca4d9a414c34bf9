"""The exception hierarchy: every error statesnap raises derives from :class:`StatesnapError`.

Each class says when it is raised and what an operator should do about it. Third-party errors
(confluent-kafka, botocore, OS errors) are translated at the boundary with ``raise ... from e``.
"""

from __future__ import annotations


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


class BrokerUnavailableError(KafkaError):
    """No broker answered within the timeout; check the bootstrap address and the network."""


class TopicNotFoundError(KafkaError):
    """The topic does not exist on the cluster; create it or fix the name."""


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


class CheckpointConflictError(CheckpointError, BlobExistsError):
    """Another writer committed this generation first; re-read the newest checkpoint and retry."""


class NoUsableCheckpointError(CheckpointError):
    """``require_checkpoint=True`` was asked for but no checkpoint verifies."""


# --- tables -------------------------------------------------------------------------------------


class TableError(StatesnapError):
    """A table was used in a way its state does not allow."""


class ReadOnlyTableError(TableError):
    """A write was attempted through a read-only table (a follower); followers never write."""


class TableStateError(TableError):
    """A method was called in the wrong lifecycle state (e.g. ``get`` before ``start``)."""

    def __init__(self, action: str, state: str, expected: str) -> None:
        super().__init__(f"cannot {action}: table is {state}, expected {expected}")
        self.action = action
        self.state = state
        self.expected = expected


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


class EngineOptionError(ConfigError):
    """An option was given to an engine that cannot honour it (e.g. ``--store rocksdb`` on Spark).

    The message names the option and the engine that can; nothing was read or written.
    """


class SnapshotStoreError(SnapshotError, ConfigError):
    """The snapshot store spec is malformed or does not match the one the table was created with."""
