"""`gpuq gpus --local`: this host's GPUs as the supervisor sees them, through real pynvml (the NVML stand-in)."""

from click.testing import CliRunner

from gpuq.cli.main import main
from tests.nvml_standin import StandinMig, gpu_uuid, mig_uuid


def test_gpus_lists_mig_devices_and_says_which_gpu_is_lost(nvml, tmp_path):
    nvml.gpus[0].mig_mode, nvml.gpus[0].max_mig = True, 7
    nvml.gpus[0].migs = [StandinMig(mig_uuid(0, 1), slot=1)]
    nvml.gpus.append(type(nvml.gpus[1])(gpu_uuid(2), "NVIDIA L4", memory_mib=23034))
    nvml.lose(1)
    result = CliRunner(env={"GPUQ_DATA_DIR": str(tmp_path)}).invoke(main, ["gpus", "--local"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].endswith(": 2 GPU(s) from nvml")
    assert lines[2].startswith("0-mig1") and mig_uuid(0, 1) in lines[2]
    assert lines[3].startswith("2 ") and gpu_uuid(2) in lines[3]
    assert lines[-1] == "GPU 1 (UUID unknown): unusable, NVML: GPU is lost; it gets no worker"
