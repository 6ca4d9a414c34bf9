.DEFAULT_GOAL := help
VENV := .venv/bin

help:  ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

setup:  ## Create .venv with statesnap and its test and Spark extras
	bash scripts/setup.sh

demo: setup  ## Run the end-to-end demo on the embedded broker
	$(VENV)/statesnap demo

test:  ## Run the default test suite (CI's; tests marked long are deselected)
	$(VENV)/python -m pytest

test-long:  ## Run every test, the long variants too
	STATESNAP_LONG=1 $(VENV)/python -m pytest

test-fast:  ## Unit tests only
	$(VENV)/python -m pytest tests/unit

faults:  ## Fault-injection suite, long mode (more kills, S3 corruptions, Spark kill, cluster faults); prints a summary
	STATESNAP_FAULTS=long STATESNAP_LONG=1 $(VENV)/python -m pytest tests/faults tests/integration/cluster

lint:  ## ruff + mypy
	$(VENV)/ruff check src tests benchmarks examples
	$(VENV)/mypy

bench:  ## Restore benchmark (prints a table)
	$(VENV)/python benchmarks/restore.py

bench-spark:  ## Spark bootstrap vs single process, source read rate
	$(VENV)/python benchmarks/spark_bootstrap.py

bench-peers:  ## statesnap restore vs Kafka Streams' changelog restore on Apache Kafka (needs Java, Maven)
	$(VENV)/python benchmarks/peers.py

bench-all: bench bench-spark  ## Every benchmark
	$(VENV)/python benchmarks/snapshot.py
	$(VENV)/python benchmarks/follower.py
	$(VENV)/python benchmarks/scale.py
	$(VENV)/python benchmarks/checkpoint_cost.py
	$(VENV)/python benchmarks/engine_crossover.py
	$(VENV)/python benchmarks/spark_startup.py
