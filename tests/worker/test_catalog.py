"""What a worker serves, from SQL: rules, memory (a group's per-GPU reserves), health, and
the models it skips for now."""

from gpuq import store
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Gpu, Model
from worker.catalog import ModelCatalog

MODEL = "smollm2-135m"


def add_gpus(session, *sizes_gib, unhealthy=()):
    for i, size in enumerate(sizes_gib):
        session.add(
            Gpu(
                uuid=f"GPU-{i}",
                host="node1",
                index=i,
                name=f"Test {size}G",
                memory_total_mib=size * 1024,
                simulated=False,
                healthy=i not in unhealthy,
            )
        )
    session.commit()


def add_model(session, name, vram_mib, per_gpu_mib):
    bundled = store.get_model(session, MODEL)
    session.add(
        Model(
            name=name,
            path=bundled.path,
            can_generate=True,
            can_embed=False,
            context_length=512,
            context_length_trained=8192,
            size_bytes=1,
            architecture="llama",
            vram_estimate_mib=vram_mib,
            vram_per_gpu_mib=per_gpu_mib,
        )
    )
    session.commit()


def catalog_for(database_url, uuids, **options):
    engine = sync_engine(database_url)
    return ModelCatalog(sync_sessions(engine), gpu_uuids=uuids, **options), engine


def test_a_group_serves_a_model_only_when_its_gpus_hold_it_with_each_ones_reserve(session, database_url):
    add_gpus(session, 24, 24, 24)
    add_model(session, "fits-two", 40_000, per_gpu_mib=5_000)  # 45000 on two GPUs <= 49152
    add_model(session, "needs-three", 40_000, per_gpu_mib=10_000)  # 50000 on two > 49152
    pair, engine = catalog_for(database_url, ("GPU-0", "GPU-1"))
    assert pair.refresh() == [("fits-two", "generate"), ("fits-two", "noop")]
    assert pair.get("fits-two").vram_mib == 45_000  # what its cache counts on the two GPUs
    single, _ = catalog_for(database_url, ("GPU-2",))
    assert {m for m, _k in single.refresh()} == {MODEL}  # single GPUs take what fits one
    engine.dispose()


def test_an_unhealthy_gpu_serves_nothing_and_skipped_models_are_left_alone(session, database_url):
    add_gpus(session, 24, 24, unhealthy={1})
    skipped = set()
    healthy, engine = catalog_for(database_url, ("GPU-0",), skip=lambda: skipped)
    assert healthy.refresh() == [(MODEL, "embed"), (MODEL, "generate"), (MODEL, "noop")]
    skipped.add(MODEL)  # marked too small there, or stepped back from
    assert healthy.refresh() == []
    sick, _ = catalog_for(database_url, ("GPU-1",))
    assert sick.refresh() == []
    engine.dispose()


def test_workers_sharing_a_gpu_each_budget_their_share(session, database_url):
    add_gpus(session, 24)
    shared, engine = catalog_for(database_url, ("GPU-0",), gpu_share=2)
    shared.refresh()
    assert (shared.slot.memory_total_mib, shared.slot.budget_mib) == (24 * 1024, 12 * 1024)
    engine.dispose()
