"""``statesnap.materialize.materialize`` called as a user's program calls it: a fresh interpreter
that imports the library, runs the Python engine against the session's broker (Apache Kafka; Tansu too)
and gets a typed result back; the library prints nothing, its progress reaches the listener."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

from integration.cli_runner import digest, ok, statesnap

PARTITIONS = 3

#: The user's program: three materializations of one topic (first, incremental, nothing new),
#: each result as the object's own fields, its ``to_json()`` and its ``summary()``.
PROGRAM = textwrap.dedent(
    """
    import json, sys
    from dataclasses import FrozenInstanceError

    from statesnap import CheckpointOptions
    from statesnap.materialize import Engine, MaterializeProgress, MaterializeResult, materialize

    bootstrap, topic, url = sys.argv[1:4]

    class Seen(MaterializeProgress):
        def __init__(self):
            self.events = []

        def engine_chosen(self, choice):
            self.events.append(["engine", str(choice.engine)])

        def stage(self, stage):
            self.events.append(["stage", stage.name])

        def replay_finished(self, records, label):
            self.events.append(["replayed", records, label])

    runs = []
    for _ in range(int(sys.argv[4])):
        seen = Seen()
        r = materialize(topic, bootstrap_servers=bootstrap, checkpoints=CheckpointOptions(url),
                        engine=Engine.PYTHON, progress=seen)
        assert isinstance(r, MaterializeResult), type(r)
        try:
            r.keys = 0
        except FrozenInstanceError:
            frozen = True
        else:
            frozen = False
        runs.append({
            "fields": {"checkpoint": r.checkpoint, "written": r.written, "keys": r.keys,
                       "offsets": {str(p): o for p, o in r.offsets.items()},
                       "engine": r.engine.engine.value, "reason": r.engine.reason,
                       "restore": [r.restore.checkpoint, r.restore.replayed_records],
                       "followed": r.followed is not None, "url": r.url},
            "json": r.to_json(),
            "summary": r.summary(),
            "frozen": frozen,
            "events": seen.events,
        })
    print(json.dumps(runs, default=str))
    """
)


def _records(n: int, seed: int) -> list[tuple[int, bytes | None, bytes | None]]:
    out: list[tuple[int, bytes | None, bytes | None]] = []
    for i in range(n):
        k = (i * 7919 + seed) % 200
        value = None if (i + seed) % 17 == 0 else b"v%d-%d" % (seed, i)
        out.append((k % PARTITIONS, b"k%04d" % k, value))
    return out


def _run(kafka: Any, topic: str, url: str, times: int, program: Path) -> list[dict[str, Any]]:
    """The user's program in a fresh interpreter; its stdout must be its own print alone."""
    result = subprocess.run(
        [sys.executable, str(program), kafka.bootstrap, topic, url, str(times)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout[-3000:]  # the library printed nothing of its own
    runs: list[dict[str, Any]] = json.loads(lines[0])
    return runs


def test_materialize_as_a_library_returns_a_typed_result(kafka: Any, tmp_path: Path) -> None:
    """First run from the start of the topic, a second incremental run, a third with nothing new:
    each a frozen ``MaterializeResult`` whose fields, ``to_json()`` (the CLI's ``--json`` keys)
    and ``summary()`` agree with the topic's ground truth and with a restore by ``statesnap
    dump``. Offsets equal the records' last offsets + 1: exact on the dev broker (Tansu), whose
    high watermarks the run never relies on."""
    topic = kafka.create_topic(f"mat-api-{uuid.uuid4().hex[:8]}", PARTITIONS)
    url = str(tmp_path / "ckpt")
    program = tmp_path / "user_program.py"
    program.write_text(PROGRAM)

    kafka.produce(topic, _records(1500, 1))
    (first,) = _run(kafka, topic, url, 1, program)
    kafka.produce(topic, _records(400, 2))
    second, third = _run(kafka, topic, url, 2, program)

    everything = kafka.read_all(topic, range(PARTITIONS))
    truth = kafka.truth(everything)
    ends = {str(p): o for p, o in kafka.end_offsets(everything, range(PARTITIONS)).items()}
    assert first["fields"]["restore"] == [None, 1500]
    assert (first["fields"]["checkpoint"], first["fields"]["written"]) == (1, True)
    assert first["summary"].startswith("checkpoint 1 of " + topic + " by python: ")
    assert "read 1,500 records from the start of the topic" in first["summary"]
    assert second["fields"]["restore"] == [1, 400]
    assert (second["fields"]["checkpoint"], second["fields"]["written"]) == (2, True)
    assert second["fields"]["keys"] == len(truth)
    assert second["fields"]["offsets"] == ends
    assert (third["fields"]["checkpoint"], third["fields"]["written"]) == (2, False)
    assert third["summary"] == "no new records since checkpoint 2; nothing written"
    for run in (first, second, third):
        fields, as_json = run["fields"], run["json"]
        assert run["frozen"]
        assert (fields["engine"], fields["reason"]) == ("python", "asked for with --engine python")
        assert not fields["followed"]
        assert set(as_json) == {
            "table", "topic", "engine", "engine_reason", "checkpoint", "written", "keys", "offsets",
            "restore", "checkpoint_seconds", "seconds", "bytes", "url",
        }  # fmt: skip
        assert set(as_json["restore"]) == {"checkpoint", "replayed_records", "restore_seconds"}
        assert (as_json["checkpoint"], as_json["keys"], as_json["url"]) == (
            fields["checkpoint"],
            fields["keys"],
            fields["url"],
        )
        # Progress reached the listener, in order: the engine, the catch-up (the Python engine's
        # reading stage, where a stop request checkpoints what was read), the replay, the commit.
        assert run["events"][0] == ["engine", "python"]
        assert ["stage", "CATCHING_UP"] in run["events"]
        assert run["events"][-1] == ["stage", "COMMITTED"]
        replayed = [e for e in run["events"] if e[0] == "replayed"]
        assert replayed == [["replayed", fields["restore"][1], f"restored {topic}"]]

    dumped = ok(statesnap("dump", "-b", kafka.bootstrap, "-t", topic, "-c", url, "--digest", "--json"))
    assert (dumped["checkpoint"], dumped["replayed_records"]) == (2, 0)
    assert (dumped["keys"], dumped["digest"]) == (len(truth), digest(truth))
