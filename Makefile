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

test: install-test lint
	.venv/bin/pytest

# Neither PostgreSQL nor started API/worker processes nor a browser (markers set in tests/conftest.py).
test-fast: install
	.venv/bin/pytest -m "not e2e and not postgres and not browser"

# Two checkouts' fast tiers at once, both must pass (runs share one Redis and PostgreSQL):
# for a quiet machine, see scripts/two_test_runs.sh.
test-two-runs:
	./scripts/two_test_runs.sh

bench: install
	.venv/bin/python -m bench
