"""The Apache Kafka dev broker's cluster ids: Kafka's storage tool takes an id starting with ``-``
for an option, so one in 64 random ids would fail the broker's format step."""

from __future__ import annotations

import re

from statesnap.devstack.apache import new_cluster_id


def test_cluster_ids_are_kraft_ids_that_never_start_with_a_dash() -> None:
    ids = [new_cluster_id() for _ in range(5000)]
    assert all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", i) for i in ids)
    assert len(set(ids)) == len(ids)
