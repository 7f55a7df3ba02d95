#!/usr/bin/env bash
# `make lint`: style, formatting, the layering contracts, types and the docs' mechanical claims.
# `make test` runs it beside the tests (see the Makefile).
set -euo pipefail
cd "$(dirname "$0")/.."
set -x
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
.venv/bin/mypy
.venv/bin/python scripts/check_docs.py
