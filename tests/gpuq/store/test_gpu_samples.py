"""GPU telemetry history in SQL: written per GPU, nulls where a GPU gives no reading, pruned by age."""

from datetime import timedelta

from gpuq import store
from gpuq.db.tables import utcnow
from gpuq.fleet.gpus import GpuInfo, simulated_inventory, with_free_memory
from tests.conftest import both_databases

REAL = GpuInfo(
    index=0,
    uuid="GPU-1234",
    name="NVIDIA H100",
    memory_total_mib=81559,
    memory_free_mib=60000,
    utilisation_pct=87,
    temperature_c=64,
    power_w=412.5,
    compute_capability="9.0",
)


@both_databases
def test_samples_keep_every_reading_and_nulls_for_what_a_simulated_gpu_lacks(session):
    simulated = with_free_memory(simulated_inventory("node1", [24]).gpus[0], 1000)
    now = utcnow()
    assert store.record_gpu_samples(session, "node1", [REAL, simulated], at=now) == 2
    real_row = store.gpu_samples(session, gpu_uuid=REAL.uuid)[0]
    assert (real_row.utilization_pct, real_row.temperature_c, real_row.power_w) == (87, 64, 412.5)
    assert (real_row.memory_used_mib, real_row.memory_total_mib, real_row.host) == (21559, 81559, "node1")
    sim_row = store.gpu_samples(session, gpu_uuid=simulated.uuid)[0]
    assert (sim_row.memory_used_mib, sim_row.memory_total_mib) == (1000, 24 * 1024)
    assert (sim_row.utilization_pct, sim_row.temperature_c, sim_row.power_w) == (None, None, None)
    assert sim_row.sampled_at == now


@both_databases
def test_pruning_deletes_only_samples_older_than_the_cutoff(session):
    now = utcnow()
    for days_ago in (40, 31, 29, 0):
        store.record_gpu_samples(session, "node1", [REAL], at=now - timedelta(days=days_ago))
    assert store.prune_gpu_samples(session, before=now - timedelta(days=30)) == 2
    kept = store.gpu_samples(session)
    assert [round((now - s.sampled_at) / timedelta(days=1)) for s in kept] == [29, 0]
    assert len(store.gpu_samples(session, since=now - timedelta(hours=1))) == 1
