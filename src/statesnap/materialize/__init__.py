"""Materialize a topic's table into checkpoints, on the Python engine or on Spark.

:func:`materialize` is what ``statesnap materialize`` runs: it picks the engine (``auto``
estimates both from the backlog and says why), runs it, and returns a typed
:class:`MaterializeResult` whose ``to_json()`` is the command's ``--json`` output::

    from statesnap.materialize import materialize

    result = materialize("orders", bootstrap_servers="127.0.0.1:9092", checkpoints="./ckpt")
    print(result.summary())

- :mod:`~statesnap.materialize.engine`: the engine choice and which options each honours;
- :mod:`~statesnap.materialize.python_run` / :mod:`~statesnap.materialize.spark_run`: the runs;
- :mod:`~statesnap.materialize.result`: what a run did; :mod:`~statesnap.materialize.progress`:
  what it tells a listener while it runs; :mod:`~statesnap.materialize.options`: the follow and
  Spark-only bundles.
"""

from __future__ import annotations

from statesnap.materialize.api import materialize
from statesnap.materialize.engine import Engine, EngineChoice, choose_engine, spark_available
from statesnap.materialize.options import FollowOptions, SparkOptions
from statesnap.materialize.progress import MaterializeProgress, Stage
from statesnap.materialize.result import Followed, MaterializeResult, RestoreFigures

__all__ = [
    "Engine",
    "EngineChoice",
    "FollowOptions",
    "Followed",
    "MaterializeProgress",
    "MaterializeResult",
    "RestoreFigures",
    "SparkOptions",
    "Stage",
    "choose_engine",
    "materialize",
    "spark_available",
]
