"""GPUs recorded in the inventory (the ``gpus`` table) as a supervisor records them."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from gpuq import store
from gpuq.db.tables import Gpu
from gpuq.fleet.gpus import GpuInfo


def record_gpus(session: Session, host: str, gpus: Sequence[GpuInfo]) -> None:
    store.upsert_gpus(
        session,
        [
            Gpu(uuid=g.uuid, host=host, index=g.index, name=g.name, memory_total_mib=g.memory_total_mib,
                simulated=g.simulated)
            for g in gpus
        ],
    )  # fmt: skip
