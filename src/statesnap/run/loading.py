"""Finding and rebuilding the processor ``statesnap run`` runs: what the command line names and
overrides, before the run (:func:`statesnap.run.processor.run_processor`) starts it.

:func:`load_processor` finds the user's :class:`Processor` from ``MODULE:OBJECT`` (as uvicorn
finds an app); :func:`with_overrides` rebuilds it with what the command line overrides.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from statesnap.checkpoint import RetentionPolicy
from statesnap.errors import ConfigError, TableStateError
from statesnap.processor.processor import Processor
from statesnap.task.options import CheckpointOptions, GroupOptions, SnapshotOptions, StaticShare, StoreOptions

__all__ = ["CheckpointOverrides", "ProcessorOverrides", "load_processor", "with_overrides"]


def load_processor(spec: str) -> Processor:
    """The :class:`Processor` named by ``MODULE:OBJECT`` (``OBJECT`` may be dotted), the module
    imported from the current directory or ``PYTHONPATH``. Anything else is one
    :class:`ConfigError` saying what is wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"{spec!r} is not MODULE:OBJECT: name the module and the Processor in it, as in app:proc"
        )
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, "")  # the current directory, as `python -m` and uvicorn import from it
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name == e.name or module_name.startswith(f"{e.name}.")):
            raise ConfigError(
                f"cannot import module {module_name!r}: no such module here (run from the directory that "
                "holds it, or put that directory on PYTHONPATH)"
            ) from None
        raise ConfigError(f"module {module_name!r} failed to import: {type(e).__name__}: {e}") from e
    except Exception as e:  # the user's module raised while it ran
        raise ConfigError(f"module {module_name!r} failed to import: {type(e).__name__}: {e}") from e
    found: Any = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            processors = sorted(n for n, v in vars(module).items() if isinstance(v, Processor))
            hint = f" (its processors: {', '.join(processors)})" if processors else " (it has no Processor)"
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}{hint}") from None
    if not isinstance(found, Processor):
        raise ConfigError(f"{spec} is a {type(found).__name__}, not a statesnap Processor")
    return found


@dataclass(frozen=True, slots=True)
class CheckpointOverrides:
    """Checkpoint settings given on the command line; None keeps what the processor was built with
    (a new ``location`` starts from the library defaults and *storage_options* alone: options of
    another store would not apply)."""

    location: str | None = None
    storage_options: Mapping[str, str] | None = None
    interval: timedelta | None = None
    commit_interval: timedelta | None = None
    generation: int | None = None
    snapshot_store: str | None = None
    snapshot_timeout: timedelta | None = None
    min_count: int | None = None
    min_age: timedelta | None = None
    orphan_grace: timedelta | None = None

    def apply(self, name: str, built: str | Any | CheckpointOptions | None) -> CheckpointOptions:
        """The processor's checkpoint options (*built*) with these overrides."""
        base: CheckpointOptions | None
        if self.location is not None:
            base = CheckpointOptions(self.location, storage_options=self.storage_options)
            if isinstance(built, CheckpointOptions):  # keep how it writes: intervals, retention, …
                base = dataclasses.replace(
                    built, location=self.location, storage_options=base.storage_options
                )
        else:
            base = CheckpointOptions.of(built)
            if base is None:
                raise ConfigError(
                    f"processor {name!r} has no checkpoint store: give --checkpoints URL (a run "
                    "writes a checkpoint)"
                )
            if self.storage_options:
                base = dataclasses.replace(
                    base, storage_options={**base.storage_options, **self.storage_options}
                )
        changes: dict[str, Any] = {}
        if self.interval is not None:
            changes["interval"] = self.interval
        if self.commit_interval is not None:
            changes["commit_interval"] = self.commit_interval
        if self.generation is not None:
            changes["generation"] = self.generation
        if self.snapshot_store is not None or self.snapshot_timeout is not None:
            old = base.snapshots
            changes["snapshots"] = SnapshotOptions(
                self.snapshot_store if self.snapshot_store is not None else old.store,
                self.snapshot_timeout if self.snapshot_timeout is not None else old.timeout,
                old.task_id,
            )
        if self.min_count is not None or self.min_age is not None or self.orphan_grace is not None:
            old_policy = base.retention
            changes["retention"] = RetentionPolicy(
                self.min_count if self.min_count is not None else old_policy.min_count,
                self.min_age if self.min_age is not None else old_policy.min_age,
                self.orphan_grace if self.orphan_grace is not None else old_policy.orphan_grace,
            )
        return dataclasses.replace(base, **changes) if changes else base


@dataclass(frozen=True, slots=True)
class ProcessorOverrides:
    """What the command line overrides of a processor's connection and task settings (None: as
    the processor was built)."""

    bootstrap_servers: str | None = None
    kafka_config: Mapping[str, Any] | None = None
    timeout: float | None = None
    checkpoints: CheckpointOverrides = CheckpointOverrides()
    store: StoreOptions | None = None
    share: StaticShare | GroupOptions | None = None


def with_overrides(proc: Processor, overrides: ProcessorOverrides) -> Processor:
    """A new processor with *proc*'s stores, handlers, punctuators and serdes and *overrides*'
    settings; *proc* itself is left as it was (it must not have been started).

    It is :meth:`Processor.replace` with the command line's overrides."""
    settings = proc.settings
    changes: dict[str, Any] = {
        "checkpoints": overrides.checkpoints.apply(proc.name, settings.checkpoints),
    }
    if overrides.bootstrap_servers is not None:
        changes["bootstrap_servers"] = overrides.bootstrap_servers
    if overrides.kafka_config is not None:
        changes["kafka_config"] = {**dict(settings.kafka_config or {}), **overrides.kafka_config}
    if overrides.timeout is not None:
        changes["timeout"] = overrides.timeout
    if overrides.store is not None:
        changes["store"] = overrides.store
    if isinstance(overrides.share, StaticShare):
        changes.update(partitions=overrides.share, group=None)
    elif isinstance(overrides.share, GroupOptions):
        changes.update(partitions=None, group=overrides.share)
    try:
        return proc.replace(**changes)
    except TableStateError:
        raise ConfigError(
            f"processor {proc.name!r} was already started in its module; build it, do not start it"
        ) from None
