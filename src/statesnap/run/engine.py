"""Which engine runs a task — a table's materialization or a processor's run — and which options
each engine honours: the one place an engine is chosen (:func:`choose_engine`).

Both engines are writers of one system (same checkpoints, snapshots and GC); they differ in cost.
A Spark job pays a fixed start-up (a JVM, a session, Python workers) and then reads partitions in
parallel on every core; the Python engine starts at once and replays in one process. ``auto``
estimates both from the backlog and picks the cheaper, and says why. The rates below come from
``benchmarks/engine_crossover.py`` on the reference 2-core machine; override them with the
environment variables named in :data:`ENV` where a cluster differs.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from statesnap.checkpoint import CheckpointRepository
from statesnap.errors import ConfigError, EngineOptionError
from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.backlog import estimate_backlog, high_watermarks
from statesnap.kafka.config import KafkaSettings
from statesnap.task.opening import Engine, open_checkpoint_store
from statesnap.task.options import CheckpointOptions

__all__ = [
    "ENV",
    "MASTER_ENV",
    "OPTION_NAMES",
    "PYTHON_ONLY",
    "PYTHON_RATE",
    "SPARK_BOOTSTRAP_MODULE",
    "SPARK_EMITS_NOTHING",
    "SPARK_ONLY",
    "SPARK_RATE_PER_CORE",
    "SPARK_STARTUP",
    "WHY_PYTHON",
    "Engine",
    "EngineChoice",
    "choose_engine",
    "crossover",
    "estimate_seconds",
    "estimate_table_backlog",
    "option_name",
    "parse_engine",
    "spark_available",
    "spark_processor_available",
]

# Measured by benchmarks/engine_crossover.py on the reference 2-core machine (first checkpoint of
# 0.1-3 M records, 8 partitions, a new process each): python 1.6 / 3.2 / 7.0 s, spark 14.7 / 17.0 /
# 33.0 s. Spark never wins there; the model puts the crossover near 9 M records on 16 cores.
#: Records/s the Python engine replays into a table and checkpoints (one process, start-up included).
PYTHON_RATE = 430_000
#: Records/s one Spark core reads, folds and writes during bootstrap.
SPARK_RATE_PER_CORE = 80_000
#: Seconds a cold Spark session needs before its first task runs (JVM, session, workers check).
SPARK_STARTUP = 14.0
ENV = {
    "python_rate": "STATESNAP_PYTHON_RATE",
    "spark_rate": "STATESNAP_SPARK_RATE_PER_CORE",
    "spark_startup": "STATESNAP_SPARK_STARTUP_SECONDS",
}
MASTER_ENV = "STATESNAP_SPARK_MASTER"


#: The module the Spark engine's processor bootstrap lives in.
SPARK_BOOTSTRAP_MODULE = "statesnap.spark.processor_bootstrap"
#: auto's reason for running a processor in python when nothing else decides.
SPARK_EMITS_NOTHING = (
    "a processor's handlers may emit, and a Spark run over history emits nothing: auto runs "
    "processors in python (--engine spark runs the history for the stores alone)"
)


@dataclass(frozen=True, slots=True)
class EngineChoice:
    """The engine a run uses (never ``auto``) and the sentence saying why."""

    engine: Engine
    reason: str


def spark_available() -> bool:
    """Whether the Spark engine can run here: pyspark importable and a Java runtime present."""
    has_java = shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))
    return has_java and importlib.util.find_spec("pyspark") is not None


def spark_processor_available() -> bool:
    """Whether this build has the Spark engine's processor bootstrap."""
    try:
        return importlib.util.find_spec(SPARK_BOOTSTRAP_MODULE) is not None
    except ModuleNotFoundError:  # pyspark's package missing altogether
        return False


def parse_engine(engine: Engine | str) -> Engine:
    """``engine=`` as given (an :class:`Engine` or its value); anything else is one ConfigError."""
    try:
        return Engine(engine)
    except ValueError:
        raise ConfigError(f"unknown engine {engine!r}: use auto, python or spark") from None


def _rate(name: str, default: float) -> float:
    try:
        return float(os.environ.get(ENV[name], default))
    except ValueError:
        return default


def estimate_seconds(backlog: int, cores: int) -> tuple[float, float]:
    """(python, spark) seconds to materialize *backlog* records with *cores* Spark cores."""
    python = backlog / _rate("python_rate", PYTHON_RATE)
    spark = _rate("spark_startup", SPARK_STARTUP) + backlog / (
        _rate("spark_rate", SPARK_RATE_PER_CORE) * cores
    )
    return python, spark


def crossover(cores: int) -> float:
    """The backlog (records) above which Spark is expected to finish first; inf if never."""
    per_record = 1 / _rate("python_rate", PYTHON_RATE) - 1 / (
        _rate("spark_rate", SPARK_RATE_PER_CORE) * cores
    )
    return float("inf") if per_record <= 0 else _rate("spark_startup", SPARK_STARTUP) / per_record


#: Options only one engine can honour, with what to say on the other.
PYTHON_ONLY = {
    "store": "the Spark engine keeps no local state store (its tasks fold straight into files)",
    "instances": "the Spark engine reads every partition in one parallel job; run one Spark "
    "materializer per table, or --engine python for --instance/--instances",
    "group": "the Spark engine reads every partition in one parallel job and joins no consumer "
    "group; run one Spark materializer per table, or --engine python for --group",
    # A processor's outputs: a Spark run over history emits nothing (a retried task would send its
    # partition's outputs again), and the python run resuming from its checkpoint starts after
    # those records, so they would never be produced at all.
    "exactly_once": "a Spark run of a processor emits nothing, so the outputs of the records it "
    "processes would never be produced (nor by the python run that resumes from its checkpoint); "
    "use --engine python",
    "dead_letter_topic": "a Spark run of a processor sends nothing, so records its handler fails on "
    "would reach no dead-letter topic; use --engine python",
}
#: Why ``auto`` runs in python when one of these is given (the reason line says it).
WHY_PYTHON = {
    "exactly_once": "exactly-once outputs need the python engine: a Spark run of a processor emits "
    "nothing, and the python run resuming from its checkpoint would never produce them",
    "dead_letter_topic": "a dead-letter topic needs the python engine: a Spark run of a processor "
    "sends nothing there",
}
#: How a refusal names an option where its flag is not ``--`` + the key (library and CLI alike).
OPTION_NAMES = {
    "store": "--state-store (store=)",
    "exactly_once": "--exactly-once (ProcessingOptions(exactly_once=True))",
    "dead_letter_topic": "ProcessingOptions(dead_letter_topic=)",
}
SPARK_ONLY = {
    "spark_checkpoint_location": "only the Spark engine keeps a streaming checkpoint",
    "spark_conf": "only the Spark engine takes Spark settings",
}


def option_name(key: str) -> str:
    """How a message names the option *key* of :data:`PYTHON_ONLY` / :data:`SPARK_ONLY`."""
    return OPTION_NAMES.get(key, "--" + key.replace("_", "-"))


def choose_engine(
    requested: Engine | str,
    *,
    python_only: Mapping[str, bool],
    spark_only: Mapping[str, bool],
    backlog: int | Callable[[], int] | None,
    follow: bool,
    processor: bool = False,
    spark_when_available: str | None = None,
) -> EngineChoice:
    """The engine for this run and why — the one place an engine is chosen, for a table and a
    processor alike; options the chosen engine cannot honour are refused (before any I/O).

    *backlog* (records to read) may be a callable: it is estimated only when ``auto`` has to
    weigh the engines. *processor*: the task is a processor, which the Spark engine runs over its
    input's history only (it does not follow and emits nothing), so ``auto`` runs it in python
    unless an option asks for Spark. *spark_when_available*: ``auto`` runs on Spark whenever it
    can run here, for this reason (the demo shows Spark writing the checkpoint)."""
    requested = parse_engine(requested)
    if processor:
        return _for_processor(requested, python_only, spark_only, backlog, follow)
    if requested is Engine.AUTO and spark_when_available is not None and spark_available():
        return EngineChoice(Engine.SPARK, spark_when_available)
    return _weigh(requested, python_only, spark_only, backlog, follow)


def _weigh(
    requested: Engine,
    python_only: Mapping[str, bool],
    spark_only: Mapping[str, bool],
    backlog: int | Callable[[], int] | None,
    follow: bool,
) -> EngineChoice:
    """A table's choice: what is asked for, what an option needs, else the expected durations."""
    py_opts = [k for k, given in python_only.items() if given]
    sp_opts = [k for k, given in spark_only.items() if given]
    flag = "|".join(option_name(k) for k in (py_opts or sp_opts))
    if requested is Engine.SPARK:
        if py_opts:
            raise EngineOptionError(f"{flag} cannot be used with --engine spark: {PYTHON_ONLY[py_opts[0]]}")
        if not spark_available():
            raise EngineOptionError(
                "--engine spark needs pyspark (pip install 'statesnap[spark]') and Java 17"
            )
        return EngineChoice(Engine.SPARK, "asked for with --engine spark")
    if requested is Engine.PYTHON:
        if sp_opts:
            raise EngineOptionError(f"{flag} cannot be used with --engine python: {SPARK_ONLY[sp_opts[0]]}")
        return EngineChoice(Engine.PYTHON, "asked for with --engine python")
    if py_opts and sp_opts:
        raise EngineOptionError(f"{flag} and {option_name(sp_opts[0])} need different engines")
    if py_opts:
        return EngineChoice(Engine.PYTHON, WHY_PYTHON.get(py_opts[0], f"{flag} needs the python engine"))
    if sp_opts:
        return EngineChoice(Engine.SPARK, f"{option_name(sp_opts[0])} needs the spark engine")
    if not spark_available():
        return EngineChoice(Engine.PYTHON, "pyspark or Java is not installed")
    master = os.environ.get(MASTER_ENV, "")
    if master and not master.startswith("local"):
        return EngineChoice(Engine.SPARK, f"a Spark cluster is configured ({MASTER_ENV}={master})")
    cores = os.cpu_count() or 1
    if callable(backlog):
        backlog = backlog()
    if backlog is None:
        return EngineChoice(Engine.PYTHON, "the backlog is unknown; the python engine starts at once")
    py_s, spark_s = estimate_seconds(backlog, cores)
    mode = " before following" if follow else ""
    above = crossover(cores)
    if math.isinf(above):
        verdict = f"Spark is not expected to be faster at any backlog on {cores} cores"
    else:
        verdict = f"Spark is expected to be faster above about {above:,.0f} records"
    estimate = (
        f"the estimated backlog{mode} is {backlog:,} records: python ≈ {py_s:.1f}s, spark ≈ "
        f"{spark_s:.1f}s on {cores} cores; {verdict}"
    )
    return EngineChoice(Engine.SPARK if spark_s < py_s else Engine.PYTHON, estimate)


def _for_processor(
    requested: Engine,
    python_only: Mapping[str, bool],
    spark_only: Mapping[str, bool],
    backlog: int | Callable[[], int] | None,
    follow: bool,
) -> EngineChoice:
    """A processor's choice: a table's, except that only the python engine follows (the Spark
    engine runs a processor over history), this build may lack the Spark processor bootstrap,
    and ``auto`` never trades a processor's outputs for speed (a Spark run emits nothing)."""
    if follow:
        if requested is Engine.SPARK:
            raise EngineOptionError(
                "--follow cannot be used with --engine spark: the spark engine runs a processor over "
                "its input's history and stops; a python run (or proc.run()) resumes from its checkpoint"
            )
        chosen = _weigh(Engine.PYTHON, python_only, spark_only, None, True)
        if requested is Engine.AUTO:
            return EngineChoice(Engine.PYTHON, "--follow needs the python engine (spark runs history only)")
        return chosen
    if requested is Engine.SPARK:
        # Refuse what Spark cannot honour (exactly-once outputs first) before anything else.
        _weigh(requested, python_only, spark_only, None, False)
    if requested is not Engine.PYTHON and not spark_processor_available():
        if requested is Engine.SPARK:
            raise EngineOptionError(
                "--engine spark cannot run a processor in this build: it has no "
                f"{SPARK_BOOTSTRAP_MODULE} (statesnap.spark.bootstrap_processor)"
            )
        return EngineChoice(Engine.PYTHON, "the spark engine cannot run processors in this build")
    if requested is Engine.AUTO and not any(python_only.values()) and not any(spark_only.values()):
        # A processor's handlers may emit (ctx.emit), and a Spark run over history emits nothing:
        # auto never trades a processor's outputs for speed. --engine spark (or a Spark setting)
        # runs the history on Spark for the stores alone, and says what it does not produce.
        return EngineChoice(Engine.PYTHON, SPARK_EMITS_NOTHING)
    return _weigh(requested, python_only, spark_only, backlog, False)


def estimate_table_backlog(
    settings: KafkaSettings, topic: str, table: str, checkpoints: CheckpointOptions
) -> int:
    """Records a materialization would read: watermarks (an estimate) minus the newest
    checkpoint's offsets. A missing topic or broker fails here, at once."""
    admin = KafkaAdmin(settings)
    cluster_id = admin.cluster_id()
    partitions = admin.partitions(topic)
    ends = high_watermarks(settings, topic, partitions)
    latest = CheckpointRepository.for_table(open_checkpoint_store(checkpoints), cluster_id, table).latest()
    return estimate_backlog(ends, latest.offsets if latest is not None else {})
