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
	./scripts/lint.sh

# Test processes (pytest-xdist): one per core, at most 4 (each e2e test starts its own API,
# workers and Redis); every process claims its own Redis db indices (tests/conftest.py).
TEST_PROCESSES ?= $(shell n=$$(nproc); [ "$$n" -gt 4 ] && n=4; echo $$n)

# The lint runs beside the tests, not before them: its minute and a half of CPU (mypy from a
# cold cache, as in CI) fits in the time the tests spend waiting on processes and outages.
# Either failing fails the run; the lint's output comes after the tests'.
test: install-test
	@mkdir -p test-artifacts
	@./scripts/lint.sh >test-artifacts/lint.log 2>&1 & linting=$$!; \
	.venv/bin/pytest -n $(TEST_PROCESSES) --dist worksteal; tested=$$?; \
	wait $$linting; linted=$$?; cat test-artifacts/lint.log; \
	[ $$linted -eq 0 ] || echo "make test: the lint failed (its output is above)" >&2; \
	[ $$tested -eq 0 ] && [ $$linted -eq 0 ]

# Neither PostgreSQL nor started API/worker processes nor a browser (markers set in tests/conftest.py).
test-fast: install-test
	.venv/bin/pytest -n $(TEST_PROCESSES) --dist worksteal -m "not e2e and not postgres and not browser"

# Two checkouts' fast tiers at once, both must pass (runs share one Redis and PostgreSQL):
# for a quiet machine, see scripts/two_test_runs.sh.
test-two-runs:
	./scripts/two_test_runs.sh

bench: install
	.venv/bin/python -m bench
