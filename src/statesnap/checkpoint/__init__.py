"""Checkpoints: the format (manifest, data files), writing, reading/verifying and retention GC."""

from statesnap.checkpoint.discovery import discover_tables, locate_table
from statesnap.checkpoint.manifest import (
    FORMAT_VERSION,
    CheckpointManifest,
    CheckpointState,
    DataFile,
    PartitionCheckpoint,
)
from statesnap.checkpoint.repository import CheckpointRepository, VerifyResult
from statesnap.checkpoint.retention import GcReport, RetentionPolicy, collect_garbage
from statesnap.checkpoint.writer import PartitionUpdate, write_partition_files

__all__ = [
    "FORMAT_VERSION",
    "CheckpointManifest",
    "CheckpointRepository",
    "CheckpointState",
    "DataFile",
    "GcReport",
    "PartitionCheckpoint",
    "PartitionUpdate",
    "RetentionPolicy",
    "VerifyResult",
    "collect_garbage",
    "discover_tables",
    "locate_table",
    "write_partition_files",
]
