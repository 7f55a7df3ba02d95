.PHONY: install demo up test lint bench

install:
	./scripts/install.sh

demo: install
	.venv/bin/gpuq demo

up: install
	.venv/bin/gpuq up

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

test: install lint
	.venv/bin/pytest

bench: install
	.venv/bin/python -m bench
