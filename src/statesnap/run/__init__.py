"""The run layer: choose the engine, run a task — a table or a processor — in this process or on
Spark, and return one typed result; what ``statesnap materialize`` and ``statesnap run`` call.

:func:`materialize` runs a topic's table, :func:`run_processor` a processor; both choose the
engine in one place (``auto`` estimates both from the backlog and says why), refuse what it cannot
honour before any work, and return a result whose ``to_json()`` is the command's ``--json``::

    from statesnap.run import materialize

    result = materialize("orders", bootstrap_servers="127.0.0.1:9092", checkpoints="./ckpt")
    print(result.summary())

- :mod:`~statesnap.run.engine`: the one engine choice and which options each engine honours;
- :mod:`~statesnap.task.sharing` (below, for the engines too): the partition-sharing rules;
- :mod:`~statesnap.run.table` / :mod:`~statesnap.run.processor`: a table's run, a processor's;
- :mod:`~statesnap.run.in_python` / :mod:`~statesnap.run.on_spark`: the runs on each engine;
- :mod:`~statesnap.run.loading`: finding the processor ``statesnap run`` names, and its overrides;
- :mod:`~statesnap.run.result`: what a run did; :mod:`~statesnap.run.progress`: what it tells a
  listener while it runs; :mod:`~statesnap.run.options`: the follow and Spark-only bundles.

It sits above the engines (``python``, ``processor``, ``spark``) and below the CLI; nothing below
imports it (the layers contract in ``pyproject.toml``).
"""

from __future__ import annotations

from statesnap.run.engine import Engine, EngineChoice, choose_engine, spark_available
from statesnap.run.options import FollowOptions, SparkOptions, StopRequest
from statesnap.run.processor import choose_processor_engine, run_processor
from statesnap.run.progress import MaterializeProgress, Stage
from statesnap.run.result import Followed, MaterializeResult, ProcessorRunResult, RestoreFigures
from statesnap.run.table import materialize

__all__ = [
    "Engine",
    "EngineChoice",
    "FollowOptions",
    "Followed",
    "MaterializeProgress",
    "MaterializeResult",
    "ProcessorRunResult",
    "RestoreFigures",
    "SparkOptions",
    "Stage",
    "StopRequest",
    "choose_engine",
    "choose_processor_engine",
    "materialize",
    "run_processor",
    "spark_available",
]
