"""scripts/gpu_check.sh and bench/gpu_check.py, on a machine without a GPU: the table, the exit
codes, the thresholds, and the real measuring code run against the NVML stand-in (where it
must report misses, not crash)."""

import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_check
from bench.gpu_check import (
    DRY_RUN_CHECKS,
    check_vram,
    judge_build,
    judge_burst,
    judge_energy,
    judge_preemption,
    judge_restore,
    judge_vram,
    judge_worker,
)
from tests.nvml_standin import gpu_uuid
from worker.device import llama_gpu_devices

REPO = Path(__file__).resolve().parents[2]


def script(*args):
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "GPU_CHECK_PYTHON": sys.executable},
    )


def table_rows(output: str) -> dict[str, str]:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("check "))
    result_at, target_at = lines[start].index("result"), lines[start].index("target")
    rows = {}
    for line in lines[start + 2 :]:
        if not line.strip() or " checks pass" in line:
            break
        name, result = line[:result_at].strip(), line[result_at:target_at].strip()
        rows[name] = result
    return rows


def test_the_dry_run_prints_one_table_of_every_check_and_exits_0():
    done = script("--cpu-dry-run")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("DRY RUN on canned figures: nothing was measured")
    assert done.stdout.count("check ") == 1  # one table
    assert set(table_rows(done.stdout).values()) == {"ok"} and len(table_rows(done.stdout)) == 12
    assert "12 of 12 checks pass" in done.stdout


@pytest.mark.parametrize("check", DRY_RUN_CHECKS)
def test_any_miss_is_marked_in_its_row_and_makes_the_exit_non_zero(check):
    done = script("--cpu-dry-run", "--miss", check)
    assert done.returncode == 1
    rows = table_rows(done.stdout)
    assert list(rows.values()).count("MISS") == 1 and "11 of 12 checks pass; MISS:" in done.stdout


def test_without_a_gpu_the_real_run_says_so_and_exits_2():
    done = script()
    assert done.returncode == 2 and "no NVIDIA GPU answers nvidia-smi here" in done.stderr
    assert script("--frobnicate").returncode == 2
    direct = subprocess.run([sys.executable, "-m", "bench.gpu_check"], cwd=REPO, capture_output=True, text=True)
    assert direct.returncode == 2 and "no NVIDIA GPU visible through NVML" in direct.stdout


def test_the_thresholds():
    assert judge_restore(0.04, 0.5).ok and not judge_restore(0.04, 0.51).ok
    assert judge_preemption(True, 2).ok and not judge_preemption(False, 2).ok
    assert not judge_preemption(True, 0).ok  # nothing parked: nothing shown
    assert judge_vram(900, 1000).ok and not judge_vram(890, 1000).ok  # 11 % under risks out of memory
    assert judge_vram(1350, 1000).ok and not judge_vram(1360, 1000).ok
    assert not judge_vram(1000, None).ok
    assert judge_worker(100, 90, {"cuda:GPU-1"}, "GPU-1").ok
    assert not judge_worker(100, 89, {"cuda:GPU-1"}, "GPU-1").ok
    assert not judge_worker(100, 100, {"cpu"}, "GPU-1").ok  # fast, but not on the GPU: a miss
    assert judge_energy([(100, 95), (100, 120)]).ok
    assert not judge_energy([(100, 95), (None, 120)]).ok and not judge_energy([]).ok
    assert not judge_build(0).ok
    assert judge_burst(1.3, 1.2).ok and not judge_burst(1.31, 1.2).ok
    assert not judge_burst(1.4, 1.0).ok  # gpuq's own figure is judged, the engine alone's only shown


def test_the_real_checks_report_misses_on_a_cpu_build_with_the_nvml_stand_in(nvml):
    # What the GPU run would do if the CUDA build had silently come out as a CPU build.
    assert not judge_build(llama_gpu_devices()).ok
    row = check_vram(gpu_uuid(0))  # loads SmolLM2 in a process that asks NVML for its memory: none on the CPU
    assert not row.ok and "NVML: no figure" in row.measured
    failing = gpu_check.guarded("pinned worker vs direct", lambda: 1 / 0)
    assert not failing.ok and failing.measured.startswith("failed: ZeroDivisionError")
