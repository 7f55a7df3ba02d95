.PHONY: install install-test demo up test lint bench

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

test: install-test lint
	.venv/bin/pytest

bench: install
	.venv/bin/python -m bench
