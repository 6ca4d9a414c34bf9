"""``Processor``: state your code computes from Kafka records, checkpointed with its input offsets.

Example::

    proc = Processor("tally", inputs=["payments"], bootstrap_servers=BS, checkpoints=URL,
                     stores=["balances"], value_serde="json")

    @proc.handler
    def on_payment(record, ctx):
        balances = ctx.stores["balances"]
        balances[record.key] = balances.get(record.key, 0) + record.value["amount"]
        ctx.emit("balances-out", record.key, balances[record.key])

    proc.run()   # restore, catch up, keep processing; Ctrl-C = clean close

How it keeps state: every named store of a task lives in the task's one local store
(:mod:`statesnap.processor.keyspace`), so a checkpoint — taken at commit points as a table's is —
holds every store and the input offsets in one manifest, and there is no changelog topic. A
restore loads the newest verified checkpoint and runs the handlers over each input's tail.

Several inputs (``inputs=["impressions", "clicks"]``) must be co-partitioned (checked at start):
task p reads partition p of every input, merged by record timestamp (:mod:`statesnap.processor.merge`;
``record.topic`` tells them apart). The manifest's offsets are the first input's; the others' live
in the task's keyspace, so every checkpoint holds all of them. While catching up the merge waits
for every input's next record (deterministic: a restore re-runs the same order); once following,
an input with nothing new is not waited for, so the order across inputs is then that of arrival
(``max_idle`` bounds the wait for an input that says nothing). In a consumer ``group`` the group
assigns the first input; a member reads partition p of the others for each p it is given.

The determinism contract: for ``restore + process(tail) == process(everything)`` to hold, a
handler's effect on its stores must depend only on the records and the stores — use
``record.timestamp`` and ``ctx.stream_time``, never the wall clock, random numbers or outside
state. Stores can only be written during a handler or punctuator call
(:class:`~statesnap.errors.StoreAccessError` otherwise). Emitted records are delivered at least
once: those emitted after the last checkpoint are emitted again after a crash. With
``ProcessingOptions(exactly_once=True)`` they commit in one Kafka transaction with the input
offsets at every commit point (:mod:`statesnap.processor.transactions`): ``read_committed``
readers see each exactly once.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from statesnap.blob import BlobStore
from statesnap.checkpoint import CheckpointManifest
from statesnap.durations import parse_duration
from statesnap.errors import CatchUpStoppedError, ConfigError, TableStateError
from statesnap.kafka.config import KafkaSettings
from statesnap.processor.aggregations import Aggregations
from statesnap.processor.handler import Handler, ProcessorHandler, Punctuation
from statesnap.processor.joins import Joins
from statesnap.processor.migrations import per_store, row_migrations
from statesnap.processor.outputs import Outputs
from statesnap.processor.processing import ProcessingOptions
from statesnap.processor.stores import StoreReader, StoreSpec
from statesnap.processor.task import ProcessorTaskHandler
from statesnap.python.reads import SerdeName, SerdeOf
from statesnap.serde import Serde, resolve_serde
from statesnap.stores import StateStore
from statesnap.task.cluster import aborted_records_warning
from statesnap.task.engine import Task
from statesnap.task.loop import TAIL_POLL
from statesnap.task.migration import StateVersion
from statesnap.task.opening import check_table_name
from statesnap.task.options import CheckpointOptions, GroupOptions, StaticShare, StoreName, StoreOptions
from statesnap.task.restore import ProgressCallback, RestoreReport
from statesnap.task.spec import TaskSpec

__all__ = ["Processor", "ProcessorSettings"]

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class ProcessorSettings:
    """Where and how a processor runs (the keyword arguments of the same names); the part of a
    processor the command line may override, the rest being its code."""

    bootstrap_servers: str
    checkpoints: str | BlobStore | CheckpointOptions | None = None
    store: StoreName | StoreOptions = "auto"
    kafka_config: Mapping[str, Any] | None = None
    timeout: float = 15.0
    partitions: Collection[int] | StaticShare | None = None
    group: str | GroupOptions | None = None

    @property
    def checkpoints_generation(self) -> int | None:
        """The exact generation to restore (``CheckpointOptions(generation=G)``), if one is set."""
        return self.checkpoints.generation if isinstance(self.checkpoints, CheckpointOptions) else None

    def table_options(self) -> dict[str, Any]:
        """The settings as the engine's table task takes them."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


class Processor(Aggregations, Joins):
    """A stateful processor over one input topic or several co-partitioned ones: handlers, named
    stores, outputs.

    One task per input partition (all of them, a :class:`StaticShare`, or a consumer group's
    share with ``group``); a task's stores hold only its partition's keys.
    """

    def __init__(
        self,
        name: str,
        inputs: str | Iterable[str],
        *,
        bootstrap_servers: str,
        checkpoints: str | BlobStore | CheckpointOptions | None = None,
        stores: Iterable[str | StoreSpec] = (),
        key_serde: SerdeOf[Any] | SerdeName | None = None,
        value_serde: SerdeOf[Any] | SerdeName | None = None,
        kafka_config: Mapping[str, Any] | None = None,
        timeout: float = 15.0,
        store: StoreName | StoreOptions = "auto",
        partitions: Collection[int] | StaticShare | None = None,
        group: str | GroupOptions | None = None,
        processing: ProcessingOptions | None = None,
        state: int | StateVersion = 1,
    ) -> None:
        """
        Args:
            name: the processor's name: its directory in the checkpoint store (as a table's).
            inputs: the input topic, or several co-partitioned ones (the same partition count;
                partition p of every input belongs to task p, ``record.topic`` tells them apart).
                Per task the handler gets the records of every input merged by timestamp (ties:
                the input listed first), see :mod:`statesnap.processor.merge`; the checkpoint
                holds every input's offsets. The manifest's offsets are the first input's.
            bootstrap_servers: the cluster's address, as for :class:`~statesnap.Table`.
            kafka_config: librdkafka properties, as for :class:`~statesnap.Table` (the schema
                registry of ``avro`` / ``json_schema`` serdes included: ``schema.registry.url``).
            timeout: how long to wait for the cluster's answers.
            checkpoints: where checkpoints live (a URL, a blob store or :class:`CheckpointOptions`);
                None: no checkpoints (every start processes the whole input).
            stores: named stores, by name (a key-value store with the processor's serdes) or as
                :class:`StoreSpec` (own serdes, a window).
            key_serde: how the keys of input records, stores (unless a store says otherwise) and
                emitted records are (de)serialized; default raw bytes.
            value_serde: the same for their values.
            store: the local store kind holding every named store (``auto``, ``memory``,
                ``columnar``, ``rocksdb``).
            partitions: the input partitions this instance processes (a list or a
                :class:`StaticShare`; default all).
            group: a Kafka consumer group that assigns them instead.
            processing: the delivery guarantee (``exactly_once``), dead letters
                (``dead_letter_topic``) and the merge wait of several inputs (``max_idle``), as
                :class:`ProcessingOptions`; default at least once, failures stop the processor.
            state: the version of what the stores hold (bump it when a change to the code changes
                what is stored), recorded in every checkpoint: an int, or
                ``StateVersion(2, {1: {"balances": fn}})`` with per-store migrations —
                ``fn(key, value) -> (key, value) | None`` on the store's key and value bytes as
                stored (the key without the keyspace prefix, a window store's without its window
                start), turning version-1 rows into version 2, run while restoring
                (:mod:`statesnap.processor.migrations`). A checkpoint of another version is
                refused unless the migrations bring it up.

        To restore an exact snapshot generation and continue from its offsets, pass
        ``checkpoints=CheckpointOptions(url, generation=G)``.
        """
        topics = [inputs] if isinstance(inputs, str) else list(inputs)
        if not topics or len(set(topics)) != len(topics):
            raise ConfigError(f"processor {name!r}: give one or more distinct input topics (got {topics!r})")
        self.name = name
        self.inputs = tuple(topics)
        self.processing = processing if processing is not None else ProcessingOptions()
        self.state = StateVersion.of(state)
        per_store(name, self.state.migrations)  # a table's form is refused here, in one line
        self._task: Task | None = None
        self._specs: dict[str, StoreSpec] = {}
        for spec in stores:
            self.add_store(spec)
        # The registry as the constructor's kafka_config names it (schema.registry.*).
        registry = KafkaSettings(bootstrap_servers, dict(kafka_config or {}), timeout).schema_registry
        self.key_serde: Serde = resolve_serde(
            key_serde, schema_registry=registry, topic=topics[0], is_key=True
        )
        self.value_serde: Serde = resolve_serde(value_serde, schema_registry=registry, topic=topics[0])
        self._schema_registry = registry
        self._handlers: list[Handler] = []
        self._punctuations: list[Punctuation] = []
        self._settings = ProcessorSettings(
            bootstrap_servers=bootstrap_servers,
            checkpoints=checkpoints,
            store=store,
            kafka_config=kafka_config,
            timeout=timeout,
            partitions=partitions,
            group=group,
        )
        self.processing.check_rewind(name, self._settings.checkpoints_generation)
        self._outputs: Outputs | None = None
        #: What runs in the task (set with it): a store's reads go through its record handler.
        self._engine: ProcessorTaskHandler | None = None
        self._stopping = threading.Event()
        self._broker_checked = False

    def __getstate__(self) -> dict[str, Any]:
        """A processor not yet started pickles (its handlers by value, as Spark ships them to
        executors); a running task, its producer and its stop event stay behind."""
        state = dict(self.__dict__)
        state.update(_task=None, _outputs=None, _stopping=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._stopping = threading.Event()

    @property
    def settings(self) -> ProcessorSettings:
        """Where and how the processor runs: connection, checkpoints, local store, task share."""
        return self._settings

    def replace(self, **changes: Any) -> Processor:
        """A copy with the same stores, handlers, punctuators and serdes and *changes* to its
        :class:`ProcessorSettings`, or ``processing=`` (what ``statesnap run``'s options
        override). Only a processor not yet started can be copied."""
        if self._task is not None:
            raise TableStateError("copy the processor", "started", "new")
        copied = copy.copy(self)
        if "processing" in changes:
            copied.processing = changes.pop("processing")
        copied._settings = dataclasses.replace(self._settings, **changes)
        copied.processing.check_rewind(self.name, copied._settings.checkpoints_generation)
        copied._stopping = threading.Event()
        return copied

    def __repr__(self) -> str:
        return f"Processor(name={self.name!r}, inputs={list(self.inputs)!r}, stores={list(self._specs)!r})"

    # --- building ----------------------------------------------------------------------------

    def add_store(self, spec: str | StoreSpec) -> StoreSpec:
        """Declare a store (before start); a name alone is a key-value store."""
        spec = StoreSpec.of(spec)
        if spec.name in self._specs:
            raise ConfigError(f"processor {self.name!r}: store {spec.name!r} declared twice")
        self._check_building("add a store")
        self._specs[spec.name] = spec
        return spec

    @property
    def stores(self) -> Mapping[str, StoreSpec]:
        """The declared stores, by name."""
        return dict(self._specs)

    @property
    def punctuators(self) -> tuple[tuple[int, Callable[..., Any]], ...]:
        """(period ms, function) of every registered punctuator."""
        return tuple((p.every_ms, p.fn) for p in self._punctuations)

    def store_serdes(self, name: str) -> tuple[Serde, Serde]:
        """(key serde, value serde) of store *name*: its own, else the processor's."""
        spec = self._specs.get(name)
        if spec is None:
            shown = ", ".join(self._specs) or "none"
            raise ConfigError(f"processor {self.name!r} has no store {name!r} (stores: {shown})")
        return self._serdes(spec)

    def handler(self, fn: F) -> F:
        """Register *fn(record, ctx)*, called for every input record (handlers run in the order
        registered). Usable as a decorator."""
        self._check_building("add a handler")
        self._handlers.append(fn)
        return fn

    def punctuate(
        self, every: str | float | timedelta, *, offset: str | float | timedelta = 0
    ) -> Callable[[F], F]:
        """Register *fn(ctx)* to run when a task's stream time crosses a multiple of *every*,
        shifted by *offset* (``every="1m", offset="10s"``: at :10 of each minute), once per
        crossing, in the partition whose record moved it: event-time timers that a restore and a
        full re-processing fire alike."""
        every_ms = round(parse_duration(every) / timedelta(milliseconds=1))
        if every_ms <= 0:
            raise ConfigError(f"punctuation period must be positive, got {every!r}")
        offset_ms = round(parse_duration(offset) / timedelta(milliseconds=1)) % every_ms

        def register(fn: F) -> F:
            self._check_building("add a punctuator")
            self._punctuations.append(Punctuation(every_ms, fn, offset_ms))
            return fn

        return register

    def _check_building(self, action: str) -> None:
        if self._task is not None:
            raise TableStateError(action, "started", "new")

    # --- life cycle --------------------------------------------------------------------------

    def _serdes(self, spec: StoreSpec) -> tuple[Serde, Serde]:
        topic = self.inputs[0]
        ks = (
            self.key_serde
            if spec.key_serde is None
            else resolve_serde(
                spec.key_serde, schema_registry=self._schema_registry, topic=topic, is_key=True
            )
        )
        vs = (
            self.value_serde
            if spec.value_serde is None
            else resolve_serde(spec.value_serde, schema_registry=self._schema_registry, topic=topic)
        )
        return ks, vs

    def describe(self) -> dict[str, Any]:
        """What each checkpoint records of the processor (``writer.processor`` in manifests)."""
        return {
            "processor": {
                "inputs": list(self.inputs),
                "stores": {name: spec.describe() for name, spec in self._specs.items()},
            }
        }

    def _open(self, *, background: bool) -> Task:
        if self._task is not None:
            raise TableStateError("start", "started", "new")
        if not self._handlers:
            raise ConfigError(f"processor {self.name!r} has no handler: register one with @proc.handler")
        engine = self._engine = ProcessorTaskHandler(self)
        try:
            self._task = Task(self._spec(background=background), engine)
        finally:
            self._outputs = engine.outputs
        return self._task

    def _spec(self, *, background: bool) -> TaskSpec:
        """The processor's task as the engine takes it (the settings as a table's)."""
        s = self._settings
        return TaskSpec(
            name=check_table_name(self.name),
            topic=self.inputs[0],
            settings=KafkaSettings(s.bootstrap_servers, dict(s.kafka_config or {}), s.timeout),
            checkpoints=CheckpointOptions.of(s.checkpoints),
            state=StateVersion(
                self.state.version, row_migrations(self.name, self._specs, self.state.migrations)
            ),
            store=StoreOptions.of(s.store),
            partitions=s.partitions,
            group=GroupOptions.of(s.group),
            background=background,
        )

    def handler_for(self, store: StateStore, outputs: Outputs) -> ProcessorHandler:
        """The record handler running this processor's code over *store* (every engine's task
        builds it here: a Python task's, a Spark task's over one partition's history)."""
        specs = list(self._specs.values())
        return ProcessorHandler(
            name=self.name,
            store=store,
            topic=self.inputs[0],
            specs=specs,
            serdes={spec.name: self._serdes(spec) for spec in specs},
            handlers=self._handlers,
            punctuations=self._punctuations,
            key_serde=self.key_serde,
            value_serde=self.value_serde,
            outputs=outputs,
            dead_letter_topic=self.processing.dead_letter_topic,
            inputs=self.inputs,
        )

    def start(self, *, progress: ProgressCallback | None = None) -> RestoreReport:
        """Restore the newest verified checkpoint, process the input's tail until caught up, then
        keep processing on a background thread. A start that fails closes what it opened (its
        output producer too) and re-raises."""
        task = self._open(background=True)
        try:
            report = task.start(progress=progress)
            self.check_broker()
            return report
        except BaseException:
            self.close(checkpoint=False)  # the task closed itself; this closes the outputs too
            raise

    def run(self, *, follow: bool = True, progress: ProgressCallback | None = None) -> RestoreReport:
        """Restore and catch up on this thread, then (``follow``) keep processing until
        :meth:`stop` or Ctrl-C, or (not ``follow``) write a checkpoint; then close cleanly with a
        final checkpoint. Returns the restore report. A :meth:`stop` during the catch-up ends it
        between two batches with a checkpoint of what was read, and ``run`` returns."""
        task = self._open(background=False)
        clean = False
        try:
            report = task.start(progress=progress)
            self.check_broker()
            while follow and not self._stopping.is_set():
                task.poll(TAIL_POLL)
            clean = True
        except CatchUpStoppedError as e:  # stop() while catching up: its checkpoint is written
            log.info("%s", e)
            report = task.report
        except KeyboardInterrupt:
            clean = True
            log.info("processor %s: interrupted; closing with a final checkpoint", self.name)
            report = task.report
        finally:
            self.close(checkpoint=clean)
        return report

    def check_broker(self) -> None:
        """Say once (a WARNING) when this processor's exactly-once outputs run on a broker that
        shows aborted records to ``read_committed`` readers (the embedded dev broker): its readers
        may then see a record twice. Called once the task knows its cluster; ``statesnap run``
        calls it at the first restore progress report, to say it before a long catch-up."""
        task = self._task
        if self._broker_checked or not self.processing.exactly_once or task is None or not task.cluster_id:
            return
        self._broker_checked = True
        warning = aborted_records_warning(f"processor {self.name}", task.cluster_id)
        if warning is not None:
            log.warning("%s", warning)

    def stop(self) -> None:
        """Ask :meth:`run` to finish (from another thread or a signal handler); a run still
        catching up stops between two batches with a checkpoint of what it read."""
        self._stopping.set()
        if self._task is not None:
            self._task.stop_catching_up()

    def poll(self, timeout: float = 0.5) -> int:
        """Process one batch (a processor started with ``run`` polls by itself)."""
        return self._running("poll").poll(timeout)

    def checkpoint(
        self, *, full: bool = False, timeout: str | float | timedelta | None = None
    ) -> CheckpointManifest | None:
        """Write a checkpoint now (see :meth:`statesnap.Table.checkpoint`)."""
        return self._running("checkpoint").checkpoint(full=full, timeout=timeout)

    def close(self, *, checkpoint: bool = True, timeout: str | float | timedelta | None = "30s") -> None:
        """Stop processing; on a clean shutdown write a final checkpoint first."""
        task = self._task
        if task is None:
            return
        try:
            task.close(checkpoint=checkpoint, timeout=timeout)
        finally:
            if self._outputs is not None:
                self._outputs.close()

    def __enter__(self) -> Processor:
        if self._task is None:
            self.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close(checkpoint=exc_type is None)

    # --- state -------------------------------------------------------------------------------

    def _running(self, action: str) -> Task:
        if self._task is None:
            raise TableStateError(action, "new", "running")
        return self._task

    @property
    def task(self) -> Task:
        """The engine running this processor's task; for tools and tests."""
        return self._running("inspect the task")

    @property
    def report(self) -> RestoreReport:
        return self._running("report").report

    @property
    def last_checkpoint(self) -> CheckpointManifest | None:
        return self._running("read the last checkpoint").last_checkpoint

    @property
    def emitted(self) -> int:
        """Records emitted so far (sent to the producer)."""
        return 0 if self._outputs is None else self._outputs.emitted

    def store(self, name: str) -> StoreReader:
        """Store *name* as this instance holds it (every partition it owns), read-only."""
        spec = self._specs.get(name)
        if spec is None:
            shown = ", ".join(self._specs) or "none"
            raise ConfigError(f"processor {self.name!r} has no store {name!r} (stores: {shown})")
        task = self._running("read a store")
        ks, vs = self._serdes(spec)
        store = task.readable_store("read a store")
        reads = store if self._engine is None else self._engine.readable(store)
        return StoreReader(spec, ks, vs, reads, task.partitions)
