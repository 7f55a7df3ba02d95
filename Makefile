.PHONY: install install-test demo up test test-fast test-two-runs lint bench

install:
	./scripts/install.sh

install-test:
	./scripts/install.sh --with-browser

demo: install
	.venv/bin/gpuq demo

up: install
	.venv/bin/gpuq up

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports
	.venv/bin/mypy
	.venv/bin/python scripts/check_docs.py

# Test processes (pytest-xdist): one more than the cores, at most 4 (each e2e test starts its
# own API, workers and Redis, and waits on them and on the outages it causes: a spare process
# keeps the cores busy meanwhile); every process claims its own Redis db indices
# (tests/conftest.py).
TEST_PROCESSES ?= $(shell n=$$(( $$(nproc) + 1 )); [ "$$n" -gt 4 ] && n=4; echo $$n)

test: install-test lint
	.venv/bin/pytest -n $(TEST_PROCESSES) --dist worksteal

# Neither PostgreSQL nor started API/worker processes nor a browser (markers set in tests/conftest.py).
test-fast: install-test
	.venv/bin/pytest -n $(TEST_PROCESSES) --dist worksteal -m "not e2e and not postgres and not browser"

# Two checkouts' fast tiers at once, both must pass (runs share one Redis and PostgreSQL):
# for a quiet machine, see scripts/two_test_runs.sh.
test-two-runs:
	./scripts/two_test_runs.sh

bench: install
	.venv/bin/python -m bench
