# The two commands of the README. Each sets up its own environment (scripts/bootstrap, idempotent).
.PHONY: job test lint bootstrap
VENV ?= .venv

bootstrap:
	@HARNESS_VENV=$(VENV) scripts/bootstrap

# The main job: the tiny-scale suites against the real CPU stack, writing a benchmark report.
job: bootstrap
	$(VENV)/bin/ascend-rl-harness run --scale tiny --report-dir reports

# The tests: harness self-tests plus every suite (scales and hardware not present skip with the reason).
test: bootstrap
	$(VENV)/bin/python -m pytest -n 2 -p xdist

# Lint (run by .ci/run before the tests): ruff (pyflakes, pycodestyle, isort, bugbear) and the import layers.
lint: bootstrap
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
