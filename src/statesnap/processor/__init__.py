"""Stateful processors: handlers over Kafka records with named stores, checkpointed with the
input offsets (no changelog topic). See :mod:`statesnap.processor.processor`."""

from statesnap.processor.aggregations import Emit
from statesnap.processor.context import ProcessorContext, Record
from statesnap.processor.joins import JoinWindows
from statesnap.processor.processing import ProcessingOptions
from statesnap.processor.processor import Processor, ProcessorSettings
from statesnap.processor.stores import KeyValueStore, StoreKind, StoreReader, StoreSpec, WindowStore
from statesnap.processor.windows import Windows

__all__ = [
    "Emit",
    "JoinWindows",
    "KeyValueStore",
    "ProcessingOptions",
    "Processor",
    "ProcessorContext",
    "ProcessorSettings",
    "Record",
    "StoreKind",
    "StoreReader",
    "StoreSpec",
    "WindowStore",
    "Windows",
]
