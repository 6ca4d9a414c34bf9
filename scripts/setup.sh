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

# Apache Kafka for the tests that prove Kafka behaviour (compaction, retention, topic IDs, watermarks):
# the pinned broker's jars from Maven Central into a cache, once. Soft: without java or mvn the
# Tansu-based demo and tests still work, and the Apache Kafka tests are skipped.
kafka_version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' scripts/apache-kafka/pom.xml)"
kafka_home="${XDG_CACHE_HOME:-$HOME/.cache}/statesnap/apache-kafka-${kafka_version}"
kafka_libs="$kafka_home/libs"
if [ -f "$kafka_libs/kafka_2.13-${kafka_version}.jar" ]; then
  echo "setup: Apache Kafka ${kafka_version} jars already in $kafka_libs" >&2
elif ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
  echo "setup: java or mvn not found — Apache Kafka tests will be skipped (install Java 17+ and Maven, rerun)" >&2
else
  started=$SECONDS
  mkdir -p "$(dirname "$kafka_home")"
  staging="$(mktemp -d "$kafka_home.XXXXXX")"
  # Resolve into a staging dir, check kafka.Kafka runs from it, then move it in place: an
  # interrupted fetch never leaves a half-filled cache that later runs would take as complete.
  if (cd scripts/apache-kafka && mvn -q -B -Dstyle.color=never dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$staging/libs" >"$staging/mvn.log" 2>&1) \
     && [ "$(java -cp "$staging/libs/*" kafka.Kafka --version 2>/dev/null | tail -n1)" = "$kafka_version" ]; then
    mkdir -p "$kafka_home" && rm -rf "$kafka_libs" && mv "$staging/libs" "$kafka_libs"
    rm -rf "$staging"
    echo "setup: Apache Kafka ${kafka_version} jars in $kafka_libs ($((SECONDS - started))s)" >&2
  else
    reason="$(grep -m1 -E 'ERROR|Could not' "$staging/mvn.log" 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' \
              || echo 'kafka.Kafka does not load from the fetched jars')"
    rm -rf "$staging"
    echo "setup: Apache Kafka ${kafka_version} not fetched — its tests will be skipped: ${reason}" >&2
  fi
fi

# Spark's own Kafka source (spark-sql-kafka-0-10), for the tests that compare format("kafka") with
# format("statesnap-kafka") row for row and for benchmarks/kafka_sources.py: resolved once into
# benchmarks/peers/spark-kafka/target/lib (staged, then moved in place). Soft, as above.
connector_pom=benchmarks/peers/spark-kafka
connector_lib="$connector_pom/target/lib"
if ls "$connector_lib"/spark-sql-kafka-0-10_2.13-*.jar >/dev/null 2>&1; then
  echo "setup: Spark's Kafka connector already in $connector_lib" >&2
elif ! command -v mvn >/dev/null 2>&1; then
  echo "setup: mvn not found — the comparisons with Spark's own Kafka source will be skipped" >&2
else
  started=$SECONDS
  mkdir -p "$connector_pom/target"
  staging="$(cd "$connector_pom/target" && mktemp -d "$PWD/staging.XXXXXX")"
  if (cd "$connector_pom" && mvn -q -B -Dstyle.color=never dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$staging/lib" >"$staging/mvn.log" 2>&1) \
     && ls "$staging"/lib/spark-sql-kafka-0-10_2.13-*.jar >/dev/null 2>&1; then
    rm -rf "$connector_lib" && mv "$staging/lib" "$connector_lib"
    rm -rf "$staging"
    echo "setup: Spark's Kafka connector in $connector_lib ($((SECONDS - started))s)" >&2
  else
    reason="$(grep -m1 -E 'ERROR|Could not' "$staging/mvn.log" 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' \
              || echo 'no spark-sql-kafka jar resolved')"
    rm -rf "$staging"
    echo "setup: Spark's Kafka connector not fetched — its comparisons will be skipped: ${reason}" >&2
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
