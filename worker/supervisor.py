"""The supervisor: one per host. Discovers GPUs, records them, runs one pinned worker per
slot, restarts a worker that dies (with backoff), publishes GPU telemetry, watches for
GPUs that fail, and on SIGTERM drains: workers finish their current job, then everything
exits (within ``DRAIN_TIMEOUT_S``; a container's stop grace period must be longer).

Slots: one per GPU or MIG device (or ``slots_per_gpu``, each budgeting its share of the
memory), plus one per GPU group that a registered model needs because no single GPU of
the host holds it; group slots come and go as models are registered, re-registered or
removed, as rules change and as GPUs are marked unhealthy.

GPU health, as only the supervisor can see it (``gpuq/fleet/health.py``):

* a GPU NVML cannot read (lost after an Xid error, say) gets no worker at start, and one
  that stops answering later is marked unhealthy; the other GPUs carry on as before;
* a CUDA fault aborts the worker process (ggml aborts on a CUDA error), so the worker's
  own count of CUDA errors never gets far: the supervisor counts abnormal exits per slot
  instead, and ``ABNORMAL_EXITS_UNHEALTHY`` of them within ``ABNORMAL_EXIT_WINDOW_S`` mark
  the slot's GPUs unhealthy;
* a worker that refused to start on its GPUs (``EXIT_DEVICE_UNUSABLE``) has marked them
  itself, with the reason;
* a worker that could not reach Redis or the database (``EXIT_OUTAGE``) says nothing about
  its GPU: it is restarted after its backoff and never counted;
* nor does one that stopped on a defect of its own (``EXIT_DEFECT``: something raised
  where nothing handles it): recorded as crashed, restarted after its backoff, not counted.

Outages of the database or Redis do not stop the supervisor: it waits for both before its
first start (a host booting during a failover), and a mark it cannot write yet (the
database is down) is kept and written when the database answers.

Telemetry goes two ways: live readings to Redis every ``TELEMETRY_INTERVAL_S`` (short TTL,
for the API and ``/metrics``), and history to SQL (``gpu_samples``) every
``GPUQ_GPU_SAMPLE_INTERVAL_S``, pruned past ``GPUQ_GPU_SAMPLE_RETENTION_DAYS``, for the
utilisation-over-time charts.

Every start, exit (crashed, with its signal or status, or stopped) and restart of a worker
is an event in SQL (``GET /v1/events``; kept while the database is down, like the marks),
and each restart also counts in ``gpuq_worker_restarts_total``: a restarted worker has a new
name and its counts at 0, so these are what say that its predecessor crashed.

Workers are spawned, never forked, each as a fresh ``gpuq worker`` process whose
environment already has ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and ``CUDA_VISIBLE_DEVICES``
set to its GPUs' UUIDs, so CUDA is first touched with the right devices visible.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import cast

from redis import Redis
from redis.exceptions import RedisError
from rq.worker import Worker
from sqlalchemy.orm import Session, sessionmaker

from gpuq import store
from gpuq.children import spawn_child
from gpuq.db.tables import EventKind, Gpu, Model, utcnow
from gpuq.fleet import health, telemetry
from gpuq.fleet import workers as control
from gpuq.fleet.gpus import GpuInfo, Inventory, UnreadableGpu, discover_gpus, is_mig_uuid, with_free_memory
from gpuq.fleet.placement import group_for
from gpuq.fleet.snapshot import Fleet, load_fleet, request_of
from gpuq.redis_keys import GPUS_FIELD, LOADED_FIELD
from gpuq.settings import ENV_PREFIX, Settings
from gpuq.stats import metrics
from worker.exits import EXIT_DEFECT, EXIT_DEVICE_UNUSABLE, EXIT_OUTAGE
from worker.outages import is_outage, wait_for_dependencies
from worker.prefix_cache import mem_available_bytes, ram_limit_bytes

log = logging.getLogger(__name__)

LOOP_INTERVAL_S = 0.5
TELEMETRY_INTERVAL_S = 5.0
BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 60.0
STABLE_AFTER_S = 60.0  # a worker that ran this long starts its backoff afresh
DRAIN_TIMEOUT_S = 600.0
ABNORMAL_EXITS_UNHEALTHY = 3  # as the worker's own count of CUDA errors (worker/faults.py)
ABNORMAL_EXIT_WINDOW_S = 600.0


@dataclass(frozen=True, slots=True)
class SlotPlan:
    name: str
    gpu_uuids: tuple[str, ...]
    share: int = 1  # workers sharing these GPUs (``--slots-per-gpu``); each budgets 1/share of the memory


def plan_slots(inventory: Inventory, *, slots_per_gpu: int = 1, cpu_workers: int = 1) -> list[SlotPlan]:
    """One slot per GPU or MIG device (or ``slots_per_gpu``); CPU slots when the host has no
    GPU at all. A GPU NVML cannot read gets none."""
    if not inventory.gpus and not inventory.unreadable:
        return [SlotPlan(f"cpu{i}", ()) for i in range(cpu_workers)]
    return [
        SlotPlan(g.slot_name + (f"-{s}" if slots_per_gpu > 1 else ""), (g.uuid,), share=slots_per_gpu)
        for g in inventory.gpus
        for s in range(slots_per_gpu)
    ]


def group_slot(uuids_by_index: list[tuple[int, str]]) -> SlotPlan:
    indices = "+".join(str(i) for i, _ in uuids_by_index)
    return SlotPlan(f"group{indices}", tuple(u for _, u in uuids_by_index))


def plan_group_slots(host: str, fleet: Fleet, models: Sequence[Model]) -> list[SlotPlan]:
    """A slot for each GPU group some registered model needs on this host: a model no
    single GPU holds, but several of this host's GPUs together do (see ``group_for``)."""
    host_gpus = [g for g in fleet.gpus if g.target.host == host]
    groups = set()
    for model in models:
        for kind in model.kinds:
            group = group_for(request_of(model, kind), host_gpus, fleet.rules)
            if group:
                groups.add(tuple((g.target.index, g.target.uuid) for g in group))
    return [group_slot(list(members)) for members in sorted(groups)]


def worker_command(slot: SlotPlan) -> list[str]:
    command = [sys.executable, "-m", "gpuq.cli", "worker", "--slot", slot.name]
    command += ["--gpus", ",".join(slot.gpu_uuids)] if slot.gpu_uuids else []
    return command + (["--gpu-share", str(slot.share)] if slot.share > 1 else [])


def worker_environment(
    slot: SlotPlan, base: dict[str, str], *, threads: int, prefix_cache_ram_bytes: int | None = None
) -> dict[str, str]:
    """A worker's environment: its GPUs, its llama.cpp threads and, when the setting leaves it
    to the host (-1), its share of the host RAM the prefix caches may take."""
    env = dict(base)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = ",".join(slot.gpu_uuids) if slot.gpu_uuids else ""
    env[f"{ENV_PREFIX}WORKER_THREADS"] = str(threads)
    if prefix_cache_ram_bytes is not None:
        env[f"{ENV_PREFIX}WORKER_PREFIX_CACHE_RAM_BYTES"] = str(prefix_cache_ram_bytes)
    return env


def threads_per_worker(settings: Settings, workers: int, cores: int | None = None) -> int:
    """llama.cpp threads for each of a host's workers: GPUQ_WORKER_THREADS if set, else the
    host's cores shared out among its workers (at least one each). Every worker taking every
    core would oversubscribe the CPU, and llama.cpp's threads spin while they wait."""
    if settings.worker_threads > 0:
        return settings.worker_threads
    return max(1, (cores or os.cpu_count() or 1) // max(1, workers))


@dataclass
class Child:
    slot: SlotPlan
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = BACKOFF_START_S
    next_start_at: float = 0.0
    abnormal_exits: deque[float] = field(default_factory=deque)  # when, within ABNORMAL_EXIT_WINDOW_S
    last_exit: str = ""  # how its last worker ended, for the restart's event


Spawn = Callable[[SlotPlan], subprocess.Popen[bytes]]


@dataclass
class Supervisor:
    settings: Settings
    inventory: Inventory
    spawn: Spawn
    sessions: sessionmaker[Session]
    redis: Redis
    slots_per_gpu: int = 1
    cpu_workers: int = 1
    backoff_start_s: float = BACKOFF_START_S
    telemetry_interval_s: float = TELEMETRY_INTERVAL_S
    children: list[Child] = field(default_factory=list)
    _retired: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _failed: set[str] = field(default_factory=set)  # GPUs this supervisor saw NVML lose
    _unwritten_marks: list[tuple[tuple[str, ...], str]] = field(default_factory=list)  # (GPUs, reason), SQL down
    _unwritten_events: list[store.NewEvent] = field(default_factory=list)  # SQL down: written when it answers
    _retired_slots: dict[int, SlotPlan] = field(default_factory=dict)  # pid of a retired worker -> its slot

    def record_inventory(self) -> None:
        rows = [
            Gpu(
                uuid=g.uuid,
                host=self.inventory.host,
                index=g.index,
                name=g.name,
                memory_total_mib=g.memory_total_mib,
                simulated=g.simulated,
            )
            for g in self.inventory.gpus
        ]
        with self.sessions() as session:
            store.upsert_gpus(session, rows)

    def start(self) -> None:
        if not wait_for_dependencies(self.sessions, self.redis, self._stop):
            return
        self.record_inventory()
        self.mark_unreadable(self.inventory.unreadable)
        slots = plan_slots(self.inventory, slots_per_gpu=self.slots_per_gpu, cpu_workers=self.cpu_workers)
        self.children = [Child(slot, backoff_s=self.backoff_start_s) for slot in slots]
        for child in self.children:
            self._start(child)
        if self.inventory.gpus:
            self.plan_groups()

    def _start(self, child: Child) -> None:
        child.process = self.spawn(child.slot)
        child.started_at = time.monotonic()
        log.info(
            "started worker %s (pid %d) on %s",
            child.slot.name,
            child.process.pid,
            ",".join(child.slot.gpu_uuids) or "cpu",
        )
        if child.restarts:
            detail = f"restart {child.restarts} of this slot by its supervisor, after its worker {child.last_exit}"
            self.record_event(child.slot, child.process.pid, EventKind.RESTARTED, detail=detail)
            metrics.record_restart(self.redis, host=self.inventory.host, slot=child.slot.name)
        else:
            self.record_event(child.slot, child.process.pid, EventKind.STARTED)

    def record_event(
        self, slot: SlotPlan, pid: int, kind: EventKind, *, exit_status: int | None = None, detail: str | None = None
    ) -> None:
        """An event of one of this host's workers, in SQL now or, while the database is down,
        kept (with the time it happened) and written once it answers."""
        worker = f"{socket.gethostname()}.{slot.name}.{pid}"  # worker names: host.slot.pid.hex
        event = store.NewEvent(
            kind,
            host=self.inventory.host,
            slot=slot.name,
            worker=worker,
            gpu_uuids=slot.gpu_uuids,
            exit_status=exit_status,
            detail=detail,
        )
        self._unwritten_events.append(event)
        self.write_events()

    def write_events(self) -> None:
        if not self._unwritten_events:
            return
        try:
            with self.sessions() as session:
                store.record_events(session, self._unwritten_events)
        except Exception as exc:
            if not is_outage(exc):
                raise
            log.warning("could not record %d worker event(s) yet (the database is down)", len(self._unwritten_events))
            return
        self._unwritten_events.clear()

    def plan_groups(self) -> None:
        """Start a worker for each GPU group that models now need, drain the ones no longer needed."""
        with self.sessions() as session:
            wanted = plan_group_slots(self.inventory.host, load_fleet(session), store.list_models(session))
        current = {c.slot: c for c in self.children if len(c.slot.gpu_uuids) > 1}
        for slot in wanted:
            if slot not in current:
                child = Child(slot, backoff_s=self.backoff_start_s)
                self.children.append(child)
                self._start(child)
        for slot, child in current.items():
            if slot not in wanted:
                log.info("GPU group %s is no longer needed; draining its worker", slot.name)
                self.children.remove(child)
                if child.process is not None and child.process.poll() is None:
                    child.process.send_signal(signal.SIGTERM)
                    self._retired.append(child.process)
                    self._retired_slots[child.process.pid] = slot
                    detail = "its GPU group is no longer needed by any model"
                    self.record_event(slot, child.process.pid, EventKind.DRAINED, detail=detail)

    def mark_unreadable(self, unreadable: Sequence[UnreadableGpu]) -> None:
        """GPUs NVML cannot read: unhealthy in SQL, once each (by UUID, or by this host's row
        at that index when even the UUID could not be read)."""
        if not unreadable:
            return
        with self.sessions() as session:
            rows = store.list_gpus(session)
            by_index = {g.index: g.uuid for g in rows if g.host == self.inventory.host and not is_mig_uuid(g.uuid)}
        for gpu in unreadable:
            uuid = gpu.uuid or by_index.get(gpu.index) or self._uuid_at(gpu.index)
            if uuid is None or uuid in self._failed:
                continue
            self._failed.add(uuid)
            log.error("GPU %d (%s) is unusable: %s; marking it unhealthy", gpu.index, uuid, gpu.error)
            self.mark_unhealthy((uuid,), f"{gpu.error} (seen by the supervisor on {self.inventory.host})")

    def mark_unhealthy(self, gpu_uuids: tuple[str, ...], reason: str) -> None:
        """The mark in SQL now, or, while the database is down, kept and written once it answers."""
        self._unwritten_marks.append((gpu_uuids, reason))
        self.write_marks()

    def write_marks(self) -> None:
        while self._unwritten_marks:
            gpu_uuids, reason = self._unwritten_marks[0]
            try:
                health.mark_unhealthy(self.sessions, gpu_uuids, reason)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                log.warning("could not mark %s unhealthy yet (the database is down); will retry", ",".join(gpu_uuids))
                return
            self._unwritten_marks.pop(0)

    def _uuid_at(self, index: int) -> str | None:
        """The whole GPU (not a MIG device) at an NVML index, as discovered at start."""
        return next((g.uuid for g in self.inventory.gpus if g.index == index and g.mig_slot is None), None)

    def check(self) -> None:
        """Restart workers that exited, each after its backoff; count abnormal exits."""
        now = time.monotonic()
        for child in self.children:
            process = child.process
            if process is not None and process.poll() is None:
                if now - child.started_at > STABLE_AFTER_S:
                    child.backoff_s = self.backoff_start_s
                continue
            if process is not None:  # it just died: schedule the restart
                log.warning(
                    "worker %s exited with %s; restarting in %.0f s",
                    child.slot.name,
                    _exit_status(process.returncode),
                    child.backoff_s,
                )
                self._record_exit(child, process)
                child.last_exit = self._record_exit_event(child.slot, process)
                self._count_exit(child, process.returncode, now)
                child.process = None
                child.next_start_at = now + child.backoff_s
                child.backoff_s = min(child.backoff_s * 2, BACKOFF_MAX_S)
            elif now >= child.next_start_at:
                child.restarts += 1
                self._start(child)

    def _record_exit(self, child: Child, process: subprocess.Popen[bytes]) -> None:
        """Its death recorded in Redis now, not one worker TTL later (see ``record_exit``)."""
        try:
            control.record_exit(self.redis, hostname=socket.gethostname(), slot=child.slot.name, pid=process.pid)
        except RedisError:
            log.warning("could not record the exit of worker %s; its key expires instead", child.slot.name)

    def _record_exit_event(self, slot: SlotPlan, process: subprocess.Popen[bytes], *, why: str = "") -> str:
        """The exit as an event (crashed, or stopped when it meant to go); returns how it ended."""
        kind, ended = _exit_event(process.returncode)
        self.record_event(slot, process.pid, kind, exit_status=process.returncode, detail=ended + why)
        return ended

    def _count_exit(self, child: Child, returncode: int, now: float) -> None:
        if returncode == EXIT_DEVICE_UNUSABLE:
            log.error("worker %s refused to start on its GPUs; it marked them unhealthy (see its log)", child.slot.name)
            return
        if returncode == EXIT_OUTAGE:
            log.warning("worker %s could not reach Redis or the database; not counted as a crash", child.slot.name)
            return
        if returncode == EXIT_DEFECT:
            log.error("worker %s stopped on a defect (see its log); not held against its GPUs", child.slot.name)
            return
        if returncode == 0 or not child.slot.gpu_uuids:
            child.abnormal_exits.clear()
            return
        exits = child.abnormal_exits
        exits.append(now)
        while exits and now - exits[0] > ABNORMAL_EXIT_WINDOW_S:
            exits.popleft()
        if len(exits) == ABNORMAL_EXITS_UNHEALTHY:
            reason = (
                f"its worker ({child.slot.name} on {self.inventory.host}) exited abnormally "
                f"{ABNORMAL_EXITS_UNHEALTHY} times within {ABNORMAL_EXIT_WINDOW_S:.0f} s, the last "
                f"{_exit_status(returncode)}{_what_it_suggests(returncode)}"
            )
            log.error("marking %s unhealthy: %s", ",".join(child.slot.gpu_uuids), reason)
            self.mark_unhealthy(child.slot.gpu_uuids, reason)

    def read_gpus(self) -> tuple[tuple[GpuInfo, ...], dict[str, list[str]]]:
        """Fresh readings of this host's GPUs, and the models loaded on each. A GPU NVML no
        longer reads is marked unhealthy; the others are read as usual."""
        loaded = self._loaded_by_gpu()
        if self.inventory.source == "nvml":
            now = discover_gpus(host=self.inventory.host)
            fresh = now.gpus
            gone = [
                UnreadableGpu(g.index, g.uuid, "NVML no longer reports it")
                for g in self.inventory.gpus
                if now.by_uuid(g.uuid) is None and not any(u.uuid == g.uuid for u in now.unreadable)
            ]
            self._failed -= {g.uuid for g in fresh}  # readable again: a later loss is news again
            self.mark_unreadable([*now.unreadable, *gone])
        else:
            fresh = tuple(self._simulated_reading(g, loaded.get(g.uuid, [])) for g in self.inventory.gpus)
        return fresh, loaded

    def publish_telemetry(self, readings: tuple[tuple[GpuInfo, ...], dict[str, list[str]]] | None = None) -> None:
        fresh, loaded = readings or self.read_gpus()
        read = {g.uuid for g in fresh}
        absent = [g.uuid for g in self.inventory.gpus if g.uuid not in read]
        telemetry.publish(self.redis, fresh, loaded=loaded, absent=absent)

    def record_samples(self, gpus: Sequence[GpuInfo]) -> None:
        """History in SQL: a row per GPU now, and rows past the retention deleted (cheap: an
        index on the time; done here so no other process has to be scheduled for it)."""
        now = utcnow()
        with self.sessions() as session:
            store.record_gpu_samples(session, self.inventory.host, gpus, at=now)
            store.prune_gpu_samples(session, before=now - timedelta(days=self.settings.gpu_sample_retention_days))

    def _loaded_by_gpu(self) -> dict[str, list[str]]:
        loaded: dict[str, list[str]] = {}
        for worker in Worker.all(connection=self.redis):
            # Replies are bytes (no client sets decode_responses); redis-py types them bytes | str.
            fields = cast(list[bytes | None], self.redis.hmget(worker.key, GPUS_FIELD, LOADED_FIELD))
            gpus, models = ((v or b"").decode() for v in fields)
            for uuid in filter(None, gpus.split(",")):
                loaded.setdefault(uuid, []).extend(filter(None, models.split(",")))
        return loaded

    def _simulated_reading(self, gpu: GpuInfo, names: list[str]) -> GpuInfo:
        """Free memory of a simulated GPU: total less the VRAM figures of what its workers loaded."""
        with self.sessions() as session:
            used = sum(m.vram_mib for n in names if (m := store.get_model(session, n)) is not None)
        return with_free_memory(gpu, used)

    def request_stop(self, *_args: object) -> None:
        self._stop.set()

    def run(self) -> None:
        self.start()
        next_telemetry = next_sample = 0.0
        while not self._stop.wait(LOOP_INTERVAL_S):
            self.check()
            self.write_marks()
            self.write_events()
            now = time.monotonic()
            telemetry_due, sample_due = now >= next_telemetry, now >= next_sample
            if not (telemetry_due or sample_due):
                continue
            try:
                readings = self.read_gpus()
                if telemetry_due:
                    next_telemetry = now + self.telemetry_interval_s
                    self.publish_telemetry(readings)
                    if self.inventory.gpus:
                        self.plan_groups()
                if sample_due:
                    next_sample = now + self.settings.gpu_sample_interval_s
                    self.record_samples(readings[0])
            except Exception:
                log.exception("publishing telemetry, recording samples or planning GPU groups failed; will retry")
        self.drain()

    def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """SIGTERM to every worker (RQ's warm shutdown: finish the current job), then wait.
        Each exit is recorded as an event, best effort: the supervisor is on its way out."""
        for child in self.children:  # died since the last check: its exit is news too
            if child.process is not None and child.process.poll() is not None:
                self._record_exit_event(child.slot, child.process)
                child.process = None
        running = [(c.slot, c.process) for c in self.children if c.process is not None and c.process.poll() is None]
        running += [(self._retired_slots[p.pid], p) for p in self._retired if p.poll() is None]
        for _slot, process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for slot, process in running:
            why = " (its supervisor stopped and drained it)"
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker pid %d did not finish in time; killing it", process.pid)
                process.kill()
                process.wait()
                why = f" (its supervisor stopping killed it after {timeout_s:.0f} s of draining)"
            self._record_exit_event(slot, process, why=why)


def _exit_event(returncode: int) -> tuple[EventKind, str]:
    """Crashed (a signal, an error status) or stopped (a clean exit, a refusal of its GPUs, an
    outage it exits to wait out), and how it ended, in words."""
    status = _exit_status(returncode)
    if returncode == 0:
        return EventKind.STOPPED, f"exited cleanly ({status})"
    if returncode in (-signal.SIGTERM, -signal.SIGINT):  # asked to stop, and it did
        return EventKind.STOPPED, f"stopped when asked ({status})"
    if returncode == EXIT_DEVICE_UNUSABLE:
        return EventKind.STOPPED, f"refused to start on its GPUs and marked them unhealthy ({status})"
    if returncode == EXIT_OUTAGE:
        return EventKind.STOPPED, f"could not reach Redis or the database ({status})"
    if returncode == EXIT_DEFECT:
        return EventKind.CRASHED, f"crashed: a defect in the worker, its log has the traceback ({status})"
    return EventKind.CRASHED, f"crashed: {status}"


def _what_it_suggests(returncode: int) -> str:
    """What an abnormal exit points to, for the unhealthy mark: only an abort is ggml's way of
    dying on a CUDA error; the worker's log says what any other exit was."""
    if returncode == -signal.SIGABRT:
        return " (ggml aborts the process on a CUDA error)"
    return " (see the worker's log for its cause)"


def _exit_status(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def run_supervisor(settings: Settings, *, cpu_workers: int = 1, slots_per_gpu: int = 1) -> None:
    from gpuq.db.engine import sync_engine, sync_sessions

    inventory = discover_gpus(simulated=settings.simulated_gpus, host=settings.host_label)
    log.info(
        "%s: %d GPU(s) from %s%s",
        inventory.host,
        len(inventory.gpus),
        inventory.source,
        f", {len(inventory.unreadable)} unreadable" if inventory.unreadable else "",
    )
    base_env = {**os.environ}
    available = mem_available_bytes()  # before any worker loads a model: the host's own figure

    def spawn(slot: SlotPlan) -> subprocess.Popen[bytes]:
        workers = max(len(supervisor.children), 1)
        threads = threads_per_worker(settings, workers)
        ram = settings.worker_prefix_cache_ram_bytes
        share = ram_limit_bytes(ram, available=available, workers=workers) if ram < 0 else None
        env = worker_environment(slot, base_env, threads=threads, prefix_cache_ram_bytes=share)
        return spawn_child(worker_command(slot), env=env)

    supervisor = Supervisor(
        settings=settings,
        inventory=inventory,
        spawn=spawn,
        sessions=sync_sessions(sync_engine(settings.database_url)),
        redis=Redis.from_url(settings.require_redis_url()),
        slots_per_gpu=slots_per_gpu,
        cpu_workers=cpu_workers,
    )
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    signal.signal(signal.SIGINT, supervisor.request_stop)
    supervisor.run()
