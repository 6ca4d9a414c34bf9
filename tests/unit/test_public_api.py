"""Every name a package promises in ``__all__`` resolves: ``from statesnap import *`` and friends
must never raise, and nothing listed may be missing (``statesnap.__all__`` once named ``Follower``
without importing it)."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import pytest

import statesnap

#: Scripts other programs run (``python -m``, Spark's worker daemon): they offer no names.
SCRIPTS = ("__main__", "statesnap.spark.daemon")
#: Every other module of the package says in ``__all__`` what it offers, and a test imports every
#: name listed.
PACKAGES = [
    "statesnap",
    *sorted(
        m.name
        for m in pkgutil.walk_packages(statesnap.__path__, "statesnap.")
        if not m.name.endswith(SCRIPTS)
    ),
]


@pytest.mark.parametrize("name", PACKAGES)
def test_every_name_in_all_resolves(name: str) -> None:
    if name.startswith("statesnap.spark"):
        pytest.importorskip("pyspark")
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    assert exported, f"{name}.__all__ is empty"
    assert all(isinstance(n, str) for n in exported)
    assert len(exported) == len(set(exported)), f"{name}.__all__ lists a name twice"
    missing = [n for n in exported if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ names what {name} does not define: {missing}"
    namespace: dict[str, Any] = {}
    exec(f"from {name} import *", namespace)  # the star import users write
    assert set(exported) <= set(namespace)
    for n in exported:
        assert getattr(module, n) is namespace[n]


def test_the_facade_names() -> None:
    import statesnap
    from statesnap.python.follower import Follower
    from statesnap.python.table import Table

    assert statesnap.Table is Table
    assert statesnap.Follower is Follower
    for n in ("Table", "Follower", "FollowerStatus", "RestoreListener", "RestoreReport", "StatesnapError"):
        assert n in statesnap.__all__
