"""A run's result reads in one short line in a REPL or a log, not a page of nested reprs."""

from __future__ import annotations

from statesnap.run.engine import Engine, EngineChoice
from statesnap.run.result import MaterializeResult, ProcessorRunResult, RestoreFigures
from statesnap.spark.bootstrap import BootstrapResult
from statesnap.spark.processor_bootstrap import BootstrapPath, ProcessorBootstrapResult
from statesnap.task.restore import RestoreReport

from .conftest import make_manifest


def _result() -> MaterializeResult:
    figures = RestoreFigures(checkpoint=2, replayed_records=12, restore_seconds=0.5)
    choice = EngineChoice(Engine.PYTHON, "a backlog of 12 records")
    return MaterializeResult("orders", "orders", choice, 3, True, 1000, {0: 5}, figures, 0.1, 1.234, 10, None)


def test_results_have_one_short_line() -> None:
    table = _result()
    assert repr(table) == (
        "MaterializeResult(table='orders', engine=python, checkpoint=3, written=True, keys=1,000, "
        "seconds=1.23)"
    )
    run = ProcessorRunResult(table, processed=12, emitted=4, dead_lettered=0, stores={"balances": 7})
    assert repr(run) == (
        "ProcessorRunResult(processor='orders', engine=python, checkpoint=3, processed=12, emitted=4, "
        "stores={'balances': 7})"
    )
    assert len(repr(run)) < 200


def test_spark_bootstrap_results_have_one_short_line() -> None:
    """``print(bootstrap_processor(...))`` printed the whole manifest (~3 KB with its files)."""
    manifest = make_manifest(4, offsets=dict.fromkeys(range(64), 100))
    done = ProcessorBootstrapResult(
        "tally", "payments", "file:///c/x", manifest, True, BootstrapPath.HANDLER, RestoreReport(),
        0.2, 3.456, processed=1200, stores={"n": 5},
    )  # fmt: skip
    assert repr(done) == (
        "ProcessorBootstrapResult(processor='tally', checkpoint=4, written=True, path=handler, "
        "processed=1,200, stores={'n': 5}, seconds=3.46)"
    )
    table = BootstrapResult(manifest, False, RestoreReport(), 0.25)
    assert repr(table) == (
        "BootstrapResult(table='orders', checkpoint=4, written=False, keys=None, checkpoint_seconds=0.25)"
    )
