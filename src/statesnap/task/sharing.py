"""The partition-sharing rules: what a static share or a consumer group cannot go with.

Written once for every entry point — ``materialize()``, ``run_processor()`` and the commands over
them — each naming the settings in its own words (:data:`LIBRARY`'s keywords, :data:`FLAGS`'
options): a consumer group and a static share are two ways of sharing, not both; a group member
holds only the partitions it is assigned, so a one-shot run (which checkpoints every partition)
cannot be one; and a member restores each partition it gains from the newest checkpoint, so it
cannot start from a generation. They live in the task layer, beside the share bundles
(:mod:`statesnap.task.options`), so the engines below the run layer can use them too (the
Python engine's own refusals, in ``python/membership.py``, still say them on their own).
"""

from __future__ import annotations

from dataclasses import dataclass

from statesnap.errors import ConfigError
from statesnap.task.options import GroupOptions, StaticShare

__all__ = ["FLAGS", "LIBRARY", "ShareWords", "check_share", "share_refusal"]


@dataclass(frozen=True, slots=True)
class ShareWords:
    """How a refusal names the settings: a consumer group, a static share, following, a
    generation, and who restores what it gains (a group member)."""

    group: str
    static: str
    follow: str
    generation: str
    member: str


#: The library's words (keywords and bundles).
LIBRARY = ShareWords("a consumer group", "StaticShare", "follow", "a generation", "a consumer group member")
#: The command line's words (its options).
FLAGS = ShareWords("--group", "--instance/--instances", "--follow", "--generation", "--group")


def share_refusal(
    *,
    group: bool,
    static: bool,
    follow: bool,
    generation: int | None,
    run: str,
    words: ShareWords = LIBRARY,
) -> str | None:
    """The one sentence refusing this share of the partitions, or None when a run can honour it.
    *run* names the run in it (``materialize``, ``run``)."""
    if group and static:
        return f"{words.group} and {words.static} are two ways of sharing partitions; pick one"
    if group and not follow:
        return (
            f"{words.group} needs {words.follow}: a group member holds only the partitions it is "
            f"assigned, so a one-shot {run} could not checkpoint every partition"
        )
    if group and generation is not None:
        return (
            f"{words.member} restores each partition it gains from the newest checkpoint; "
            f"not with {words.generation}"
        )
    return None


def check_share(
    share: StaticShare | GroupOptions | str | None, *, follow: bool, generation: int | None, run: str
) -> None:
    """Refuse, before any I/O, a share of the partitions the run cannot honour
    (:class:`ConfigError` in the library's words); *share* a group id is a group."""
    refusal = share_refusal(
        group=isinstance(share, (GroupOptions, str)),
        static=False,
        follow=follow,
        generation=generation,
        run=run,
    )
    if refusal is not None:
        raise ConfigError(refusal)
