"""The run layer (:mod:`statesnap.run`): one engine enum, one engine choice, the partition-sharing
rules once, and the old import paths re-exporting it for one release. No broker: every refusal
here comes before any I/O."""

from __future__ import annotations

import importlib

import pytest

from statesnap.errors import ConfigError, EngineOptionError
from statesnap.run import Engine, choose_engine
from statesnap.task.options import GroupOptions, StaticShare
from statesnap.task.sharing import FLAGS, check_share, share_refusal


def test_one_engine_enum_chooses_and_is_recorded() -> None:
    """The enum a run chooses with is the one a task records in its snapshots (there were two)."""
    from statesnap.task import opening

    assert Engine is opening.Engine
    assert opening.TaskEngine is Engine  # the old name, for one release
    assert [e.value for e in Engine] == ["auto", "python", "spark"]


def test_a_processor_and_a_table_are_chosen_for_by_the_one_function() -> None:
    """A processor's rules are the one choice's: follow needs python, auto keeps outputs."""
    follow = choose_engine(
        Engine.AUTO, python_only={}, spark_only={}, backlog=None, follow=True, processor=True
    )
    assert (follow.engine, follow.reason) == (
        Engine.PYTHON,
        "--follow needs the python engine (spark runs history only)",
    )
    with pytest.raises(EngineOptionError, match="--follow cannot be used with --engine spark"):
        choose_engine("spark", python_only={}, spark_only={}, backlog=None, follow=True, processor=True)
    table = choose_engine("python", python_only={}, spark_only={}, backlog=None, follow=True)
    assert (table.engine, table.reason) == (Engine.PYTHON, "asked for with --engine python")
    with pytest.raises(ConfigError, match="unknown engine 'flink'"):
        choose_engine("flink", python_only={}, spark_only={}, backlog=None, follow=False)


def test_the_sharing_rules_in_the_library_and_the_flags_words() -> None:
    """One set of rules; the library and the command line each name the settings their way."""
    with pytest.raises(ConfigError, match=r"a consumer group needs follow: .* one-shot run could not"):
        check_share(GroupOptions("g"), follow=False, generation=None, run="run")
    with pytest.raises(ConfigError, match="a consumer group needs follow"):
        check_share("g", follow=False, generation=None, run="materialize")
    with pytest.raises(ConfigError, match=r"member restores each partition .* not with a generation"):
        check_share(GroupOptions("g"), follow=True, generation=3, run="materialize")
    check_share(StaticShare(0, 2), follow=False, generation=3, run="materialize")
    check_share(None, follow=False, generation=None, run="materialize")
    both = share_refusal(group=True, static=True, follow=True, generation=None, run="run", words=FLAGS)
    assert both == "--group and --instance/--instances are two ways of sharing partitions; pick one"
    one_shot = share_refusal(
        group=True, static=False, follow=False, generation=None, run="materialize", words=FLAGS
    )
    assert one_shot == (
        "--group needs --follow: a group member holds only the partitions it is assigned, so a "
        "one-shot materialize could not checkpoint every partition"
    )


@pytest.mark.parametrize(
    ("old", "new", "names"),
    [
        ("statesnap.materialize", "statesnap.run", ["materialize", "Engine", "MaterializeResult"]),
        ("statesnap.materialize.api", "statesnap.run.table", ["materialize"]),
        ("statesnap.materialize.engine", "statesnap.run.engine", ["choose_engine", "PYTHON_ONLY"]),
        ("statesnap.materialize.python_run", "statesnap.run.in_python", ["TaskRun", "restore_with_progress"]),
        ("statesnap.materialize.spark_run", "statesnap.run.on_spark", ["run_on_spark"]),
        ("statesnap.materialize.options", "statesnap.run.options", ["SHUTDOWN_TIMEOUT", "FollowOptions"]),
        ("statesnap.materialize.progress", "statesnap.run.progress", ["MaterializeProgress", "Stage"]),
        ("statesnap.materialize.result", "statesnap.run.result", ["MaterializeResult", "Followed"]),
        ("statesnap.processor.running", "statesnap.run.processor", ["run_processor"]),
        ("statesnap.processor.running", "statesnap.run.loading", ["load_processor", "with_overrides"]),
        ("statesnap.processor.running", "statesnap.run.result", ["ProcessorRunResult"]),
    ],
)
def test_the_old_import_paths_re_export_the_run_layer(old: str, new: str, names: list[str]) -> None:
    """``statesnap.materialize.*`` and ``statesnap.processor.running`` keep working for one
    release, as the same objects."""
    before, after = importlib.import_module(old), importlib.import_module(new)
    for name in names:
        assert getattr(before, name) is getattr(after, name), (old, name)
