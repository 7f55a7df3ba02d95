"""llama.cpp's log goes through Python logging: a worker loading a model prints none of
llama.cpp's context and KV dumps by default, and shows them, at their own level, with -v."""

import subprocess
import sys

LOAD = """
import sys
from gpuq.llama_log import route_llama_log
from gpuq.log_config import configure_logging
from worker.engine import LoadedModel

configure_logging(verbose=sys.argv[2] == "verbose", job_lines=False)
if sys.argv[3] == "routed":
    route_llama_log()
model = LoadedModel(sys.argv[1], n_ctx=512, embedding=False, threads=1, gpu_layers=0, slots=2)
print("loaded")
"""


def load_model(model_path: str, verbosity: str, routed: str = "routed") -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", LOAD, model_path, verbosity, routed], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loaded"
    return done.stderr.splitlines()


def test_a_model_load_prints_no_llama_cpp_lines_by_default(model_path):
    lines = load_model(model_path, "quiet")
    assert not [line for line in lines if "llama_context" in line or "llama_kv_cache" in line], lines


def test_verbose_shows_llama_cpps_lines_through_logging_at_their_level(model_path):
    lines = load_model(model_path, "verbose")
    assert any(" llama_cpp INFO llama_context: n_ctx" in line for line in lines), lines
    assert not any("llama_cpp WARNING llama_context: n_ctx" in line for line in lines)
    # Each line once, joined from llama.cpp's pieces, never a bare print outside logging.
    assert not [line for line in lines if line.startswith("llama_context:")]


def test_without_routing_llama_cpp_python_prints_them(model_path):
    """What the routing fixes: llama-cpp-python's own callback prints every line."""
    lines = load_model(model_path, "quiet", routed="unrouted")
    assert any(line.startswith("llama_context:") for line in lines)
