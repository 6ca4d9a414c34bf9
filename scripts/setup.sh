#!/usr/bin/env bash
# Set up a development environment from nothing: a virtual environment at .venv/ with statesnap,
# its test extras and the Spark extra installed (so .venv/bin/statesnap and .venv/bin/moto_server
# exist). Needs Python >= 3.11 and pip; Java 17 for the Spark pipelines.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  for candidate in python3.11 python3.12 python3.13 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      PYTHON="$candidate"; break
    fi
  done
fi
[ -n "$PYTHON" ] || { echo "setup: need Python >= 3.11" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $PYTHON" >&2
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test,spark]'
echo "setup: ready — .venv/bin/statesnap --help" >&2

# Resolve the runtime dependencies of the pom in $1 into the directory $2 through a staging directory
# beside it, check them with the command $3 (given the staged directory), then move them in place: an
# interrupted fetch never leaves a half-filled directory that later runs would take as complete. On
# failure prints why (Maven's first error, else $4) and returns 1.
maven_fetch() {
  local pom_dir="$1" dest="$2" check="$3" unchecked="$4" staging reason
  mkdir -p "$(dirname "$dest")"
  dest="$(cd "$(dirname "$dest")" && pwd)/$(basename "$dest")"  # Maven runs in $pom_dir
  staging="$(mktemp -d "$dest.staging.XXXXXX")"
  if (cd "$pom_dir" && mvn -q -B -Dstyle.color=never dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$staging/jars" >"$staging/mvn.log" 2>&1) \
     && "$check" "$staging/jars"; then
    rm -rf "$dest" && mv "$staging/jars" "$dest"
    rm -rf "$staging"
    return 0
  fi
  reason="$(grep -m1 -E 'ERROR|Could not' "$staging/mvn.log" 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' \
            || echo "$unchecked")"
  rm -rf "$staging"
  echo "$reason"
  return 1
}

# Apache Kafka for the tests that prove Kafka behaviour (compaction, retention, topic IDs, watermarks):
# the pinned broker's jars from Maven Central into a cache, once. Soft: without java or mvn the
# Tansu-based demo and tests still work, and the Apache Kafka tests are skipped.
kafka_version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' scripts/apache-kafka/pom.xml)"
kafka_libs="${XDG_CACHE_HOME:-$HOME/.cache}/statesnap/apache-kafka-${kafka_version}/libs"
kafka_runs() { [ "$(java -cp "$1/*" kafka.Kafka --version 2>/dev/null | tail -n1)" = "$kafka_version" ]; }
if [ -f "$kafka_libs/kafka_2.13-${kafka_version}.jar" ]; then
  echo "setup: Apache Kafka ${kafka_version} jars already in $kafka_libs" >&2
elif ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
  echo "setup: java or mvn not found — Apache Kafka tests will be skipped (install Java 17+ and Maven, rerun)" >&2
else
  started=$SECONDS
  if reason="$(maven_fetch scripts/apache-kafka "$kafka_libs" kafka_runs 'kafka.Kafka does not load from the fetched jars')"; then
    echo "setup: Apache Kafka ${kafka_version} jars in $kafka_libs ($((SECONDS - started))s)" >&2
  else
    echo "setup: Apache Kafka ${kafka_version} not fetched — its tests will be skipped: ${reason}" >&2
  fi
fi

# Spark's own Kafka source (spark-sql-kafka-0-10), for the tests that compare format("kafka") with
# format("statesnap-kafka") row for row and for benchmarks/kafka_sources.py: resolved once into
# benchmarks/peers/spark-kafka/target/lib. Soft, as above.
connector_lib=benchmarks/peers/spark-kafka/target/lib
connector_there() { ls "$1"/spark-sql-kafka-0-10_2.13-*.jar >/dev/null 2>&1; }
if connector_there "$connector_lib"; then
  echo "setup: Spark's Kafka connector already in $connector_lib" >&2
elif ! command -v mvn >/dev/null 2>&1; then
  echo "setup: mvn not found — the comparisons with Spark's own Kafka source will be skipped" >&2
else
  started=$SECONDS
  if reason="$(maven_fetch benchmarks/peers/spark-kafka "$connector_lib" connector_there 'no spark-sql-kafka jar resolved')"; then
    echo "setup: Spark's Kafka connector in $connector_lib ($((SECONDS - started))s)" >&2
  else
    echo "setup: Spark's Kafka connector not fetched — its comparisons will be skipped: ${reason}" >&2
  fi
fi

# Kafka Streams itself, the oracle of statesnap's aggregations and windows
# (tests/integration/apache/test_kafka_streams_oracle.py): built once into tests/oracle/kafka-streams/target.
# Soft, as above: without it those tests build it themselves, or skip where Java or Maven is missing.
oracle_dir=tests/oracle/kafka-streams
if [ -f "$oracle_dir/target/classes/dev/statesnap/oracle/StreamsOracle.class" ] && [ -f "$oracle_dir/target/classes/dev/statesnap/oracle/JoinOracle.class" ] && [ -d "$oracle_dir/target/lib" ]; then
  echo "setup: Kafka Streams oracle already built in $oracle_dir/target" >&2
elif ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
  echo "setup: java or mvn not found — the Kafka Streams oracle tests will be skipped" >&2
else
  started=$SECONDS
  if (cd "$oracle_dir" && mvn -q -B -Dstyle.color=never package >/dev/null 2>&1); then
    echo "setup: Kafka Streams oracle built in $oracle_dir/target ($((SECONDS - started))s)" >&2
  else
    echo "setup: Kafka Streams oracle not built — its tests will build it or skip" >&2
  fi
fi

# The Spark driver's class archive (Java AppCDS): every Spark command then starts some 4 s sooner
# (benchmarks/spark_startup.py). Made once per Java and Spark version under ~/.cache/statesnap; soft:
# without it Spark starts as usual.
if ! command -v java >/dev/null 2>&1; then
  echo "setup: java not found — the Spark pipelines need Java 17" >&2
elif archive="$(.venv/bin/python -c 'from statesnap.spark.class_archive import archive_path as a; p = a(); print(p if p and p.is_file() else "")')" && [ -n "$archive" ]; then
  echo "setup: Spark class archive already in $archive" >&2
else
  started=$SECONDS
  said="$(mktemp)"
  if made="$(.venv/bin/python -m statesnap.spark.class_archive 2>"$said")"; then
    echo "setup: Spark class archive in $made ($((SECONDS - started))s)" >&2
  else
    echo "setup: Spark class archive not made — Spark starts without it: $(tail -n1 "$said")" >&2
  fi
  rm -f "$said"
fi
