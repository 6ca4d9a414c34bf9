"""Deprecated: a processor's run lives in the run layer now, beside the table's, for one release.

:func:`run_processor` and :func:`choose_processor_engine` are :mod:`statesnap.run.processor`'s,
:class:`ProcessorRunResult` is :mod:`statesnap.run.result`'s, :func:`load_processor` and the
overrides :mod:`statesnap.run.loading`'s, :func:`spark_processor_available`
:mod:`statesnap.run.engine`'s. This module only re-exports them (the one import from the processor
package up into the run layer, named in the layers contract's ``ignore_imports``); import from
:mod:`statesnap.run` instead.
"""

from __future__ import annotations

from statesnap.run.engine import SPARK_BOOTSTRAP_MODULE, SPARK_EMITS_NOTHING, spark_processor_available
from statesnap.run.loading import CheckpointOverrides, ProcessorOverrides, load_processor, with_overrides
from statesnap.run.processor import choose_processor_engine, run_processor
from statesnap.run.result import ProcessorRunResult

__all__ = [
    "SPARK_BOOTSTRAP_MODULE",
    "SPARK_EMITS_NOTHING",
    "CheckpointOverrides",
    "ProcessorOverrides",
    "ProcessorRunResult",
    "choose_processor_engine",
    "load_processor",
    "run_processor",
    "spark_processor_available",
    "with_overrides",
]
