#!/usr/bin/env bash
# Two test runs on one machine at once, from two checkouts, as CI beside a developer: both
# must pass. The proof that runs do not collide (each claims its own pair of Redis db
# indices, and PostgreSQL databases get random names: tests/conftest.py); a collision shows
# as spurious failures in one run or both (test_jobs_api, test_reconciler, test_stats, ...).
#
#   scripts/two_test_runs.sh                  the fast tier (make test-fast's selection) twice
#   scripts/two_test_runs.sh --with-postgres  the same with every PostgreSQL variant too
#   scripts/two_test_runs.sh --keep           leave the two checkouts (and their logs) behind
#
# Runs on a quiet machine: two fast tiers at once need both cores for several minutes.
# The checkouts are git worktrees of the commit checked out here (HEAD: commit what is to be
# tested), under a fresh temporary directory, each with its own .venv from scripts/install.sh --with-browser (promtool for the alert rules)
# (the llama-cpp-python wheel cached in ~/.cache/gpuq-wheels is reused: minutes, not a build).
# The installs run one after the other; the two test runs start together. Exit status: 0 when
# both runs passed, 1 otherwise; each run's log is printed at the end (its summary line and
# durations), and kept with --keep.
set -euo pipefail
cd "$(dirname "$0")/.."

MARKERS="not e2e and not postgres and not browser"
KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --with-postgres) MARKERS="not e2e and not browser" ;;
    --keep) KEEP=1 ;;
    *) echo "two_test_runs.sh: unknown option $1 (known: --with-postgres, --keep)" >&2; exit 2 ;;
  esac
  shift
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpuq-two-runs.XXXXXX")
cleanup() {
  if [ "$KEEP" = 1 ]; then
    echo "two_test_runs.sh: checkouts and logs kept in $WORK" >&2
    return
  fi
  for n in 1 2; do git worktree remove --force "$WORK/run$n" >/dev/null 2>&1 || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

for n in 1 2; do
  git worktree add --detach "$WORK/run$n" HEAD >/dev/null
  echo "== run $n: installing into $WORK/run$n/.venv" >&2
  (cd "$WORK/run$n" && ./scripts/install.sh --with-browser >"$WORK/install$n.log" 2>&1) || {
    echo "two_test_runs.sh: install $n failed; see $WORK/install$n.log" >&2
    KEEP=1
    exit 1
  }
done

echo "== both runs start now: pytest -m \"$MARKERS\"" >&2
pids=()
for n in 1 2; do
  (cd "$WORK/run$n" && exec .venv/bin/pytest -m "$MARKERS" -p no:cacheprovider >"$WORK/run$n.log" 2>&1) &
  pids+=($!)
done
status=0
for n in 1 2; do
  if wait "${pids[$((n - 1))]}"; then
    echo "== run $n passed" >&2
  else
    echo "== run $n FAILED" >&2
    status=1
  fi
done
for n in 1 2; do
  echo "== run $n: the end of its log ($WORK/run$n.log)"
  tail -n 25 "$WORK/run$n.log"
done
exit "$status"
