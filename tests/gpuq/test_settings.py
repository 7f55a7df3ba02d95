"""Settings: a misspelled GPUQ_ variable stops gpuq at start instead of being ignored."""

import subprocess
import sys

import pytest

from gpuq.settings import Settings, UnknownSettingError, refuse_unknown_variables


def test_a_misspelled_variable_is_refused_with_the_closest_known_name(monkeypatch):
    monkeypatch.setenv("GPUQ_DATABSE_URL", "postgresql://db/gpuq")
    with pytest.raises(UnknownSettingError, match=r"GPUQ_DATABSE_URL.*did you mean GPUQ_DATABASE_URL"):
        Settings()


def test_a_variable_like_no_setting_points_to_the_readme():
    with pytest.raises(UnknownSettingError, match=r"GPUQ_FROBNICATE.*README"):
        refuse_unknown_variables({"GPUQ_FROBNICATE": "1"})


def test_known_settings_the_cli_url_and_the_test_suites_variables_pass():
    refuse_unknown_variables(
        {
            "GPUQ_DATABASE_URL": "x",
            "GPUQ_API_URL": "x",
            "GPUQ_TEST_REDIS_URL": "redis://127.0.0.1:6379",
            "GPUQ_WORKER_SLOTS": "4",
            "HOME": "/",
        }
    )


def test_the_cli_says_so_in_one_line_and_fails(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "GPUQ_DATA_DIR": str(tmp_path), "GPUQ_WORKER_THREDS": "2"}
    done = subprocess.run([sys.executable, "-m", "gpuq.cli", "jobs"], env=env, capture_output=True, text=True)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "error: unknown setting GPUQ_WORKER_THREDS in the environment: did you mean GPUQ_WORKER_THREADS?"
    ]
