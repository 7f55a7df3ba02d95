"""The worker's continuous-batching runs: many generations of one model decoded together.

RQ's loop hands the worker one job at a time. When that job is a generation, the worker
stays in a *run* until the model has no live request left. Two threads share a run:

- **the engine** (the worker's own thread) admits ready requests into free slots and steps
  the decoder; between steps it touches nothing but memory, so no Redis round trip, SQL
  claim, tokenisation or stream start ever stalls the live sequences;
- **the desk** (a thread per run) does all of that beside it: it takes waiting jobs of the
  model while slots are free, or sure to free at the step under way (a sequence at its
  length limit), in priority order, without blocking; it claims them, tokenises
  their prompts and starts their streams, and hands the engine ready requests; it publishes
  what the engine's steps produced and settles the requests that ended (outcome to the
  writer, RQ's bookkeeping), after taking the jobs for the slots they freed.

Every job keeps exactly what a job run alone has: its SQL claim, its own RQ execution and
registry entry (so ``rq info`` is true), heartbeats, cancellation, a deadline, and its
outcome through the writer.

Priorities stay intact because the desk takes through the worker's own ordered band list
(every ``high`` band, then ``normal``, then ``low``; loaded models first within each), with
the fair pick between tenants within a band (``gpuq.jobs.fair``): it admits from the first
band with a job only if it is this model's, and stops admitting as soon as a band ahead of
it, another model's, has a job waiting. The live sequences then finish, RQ's
loop takes that job next, and no ``high`` job waits behind the admission of a ``low`` one.
A drained worker, or one told to stop (SIGTERM, RQ's warm shutdown), admits nothing more
and lets the live sequences finish.

Priority also preempts. With every slot taken, the desk still looks at what waits (a peek,
each ``INTAKE_POLL_S``): a job of this model that outranks the least urgent job of the run is
taken at once, and the engine parks decoding sequences less urgent than it to make room
(``worker/decoding/parking.py``: their cells to host memory, resumed exactly where they
stopped once a stream frees, before anything less urgent than them is admitted). A parked
job stays running, in SQL and in RQ: nothing is requeued and no attempt is charged.

The run talks to its worker through ``Host``, a few verbs (``worker/run_host.py`` implements
them for the RQ worker), so it can be read (and tested) without RQ's worker class.
"""

from __future__ import annotations

import logging
import queue as queues
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from rq import Queue
from rq.executions import Execution
from rq.job import Job

from gpuq.store import ClaimedJob
from worker.decoding import BatchDecoder, DecodeError, Finished, Piece
from worker.runner import JobRunner, Prepared

log = logging.getLogger(__name__)

INTAKE_POLL_S = 0.05  # with a slot free and nothing found, look at the queues again after this long


@dataclass(frozen=True, slots=True)
class Started:
    """A job taken from its queue and claimed: RQ's execution, its cancel event, its row."""

    job: Job
    queue: Queue
    execution: Execution
    cancel: threading.Event
    claimed: ClaimedJob


class Host(Protocol):
    """What a run needs of its worker."""

    runner: JobRunner
    job_timeout_s: float
    preemption: bool  # GPUQ_WORKER_PREEMPTION: a more urgent job parks sequences for itself

    def may_take_more(self) -> bool:
        """Not drained, not stopping, and Redis and SQL answer."""

    def next_waiting(self, model: str, kind: str) -> tuple[Job, Queue] | None:
        """The job at the front of the first non-empty queue of the worker's order, if that
        queue is ``model``'s for ``kind``; None when nothing waits or something more urgent does."""

    def waiting_priority(self, model: str, kind: str) -> int | None:
        """The priority of the job ``next_waiting`` would give, left in its queue; None when it
        would give none."""

    def put_back(self, job: Job, queue: Queue) -> None:
        """Back to the front of its queue, untouched."""

    def must_run_alone(self, job: Job) -> bool:
        """It died beside others on a worker that crashed: it runs by itself next."""

    def start(self, job: Job, queue: Queue) -> Started | None:
        """RQ's execution, the monitor's watch and the SQL claim; None: not to run."""

    def end(self, job: Job, execution: Execution) -> None: ...

    def fail(self, job: Job, queue: Queue, execution: Execution) -> None: ...


@dataclass(slots=True)
class _Mailbox:
    """What the engine and the desk hand each other, with one condition to wait on."""

    ready: deque[Prepared] = field(default_factory=deque)  # desk -> engine
    outputs: queues.SimpleQueue[_Output] = field(default_factory=queues.SimpleQueue)  # engine -> desk
    wake: threading.Condition = field(default_factory=threading.Condition)
    closed: bool = False  # the desk admits nothing more
    desk_done: bool = False  # ... and has nothing in hand: the engine may end the run once idle
    engine_error: str | None = None  # the engine raised: the desk fails what it still holds, and ends
    desk_error: BaseException | None = None  # the desk raised: the engine drops its sequences, and ends
    engine_stopped: bool = False  # the engine steps no more (so the desk may fail what it holds)


@dataclass(frozen=True, slots=True)
class _Output:
    """One engine turn: requests it admitted (key, prompt tokens cached, tokens decoded so far),
    requests it could not admit (key, why), a step's pieces and finished requests."""

    admitted: tuple[tuple[str, int, int], ...] = ()
    refused: tuple[tuple[str, str], ...] = ()
    pieces: tuple[Piece, ...] = ()
    finished: tuple[Finished, ...] = ()


class GenerationRun:
    def __init__(self, host: Host, queue: Queue, model: str, kind: str) -> None:
        self._host = host
        self._queue = queue
        self._model = model
        self._kind = kind
        self._box = _Mailbox()

    def run(self, job: Job) -> None:
        desk = _Desk(self._host, self._box, self._model, self._kind)
        thread = threading.Thread(target=desk.run, args=(job, self._queue), name=f"desk-{job.id}", daemon=True)
        thread.start()
        failed = False
        try:
            failed = self._engine()
        except BaseException as exc:
            # Not a decoding failure (those end the run in order): the engine itself broke. The
            # desk must not wait for outputs that will never come.
            with self._box.wake:
                self._box.engine_error = f"the worker's engine failed: {type(exc).__name__}: {exc}"
                self._box.wake.notify_all()
            failed = True
            raise
        finally:
            with self._box.wake:
                self._box.engine_stopped = True
                self._box.wake.notify_all()
            thread.join()
            if failed or self._box.desk_error is not None:
                self._host.runner.unload(self._model)
            self._host.runner.keep_models()
        if self._box.desk_error is not None:
            raise self._box.desk_error  # for the worker's log; the desk failed every job it held

    def _engine(self) -> bool:
        """Admits and steps until the desk is done and nothing is live. True when decoding
        failed outright (the model is then unloaded, so the next job gets a fresh context)."""
        box = self._box
        decoder = None
        while True:
            ready = self._take_ready(decoder)
            if ready is None:
                return False
            admitted, refused = self._admit(ready)
            if ready:
                decoder = ready[0].decoder
            finished: list[Finished] = []
            failed = False
            freeing = decoder.freed_next_step if decoder is not None else 0
            if decoder is not None and decoder.active:
                try:
                    finished = decoder.step()
                except DecodeError as exc:
                    log.error("decoding failed with %d requests live: %s", decoder.active, exc)
                    finished = [Finished(key, error=f"{type(exc).__name__}: {exc}") for key in decoder.live_keys()]
                    decoder.abandon()
                    failed = True
            pieces = decoder.take_pieces() if decoder is not None else []
            told = bool(admitted or refused or pieces or finished)
            if told:
                box.outputs.put(_Output(tuple(admitted), tuple(refused), tuple(pieces), tuple(finished)))
            # A step with nothing to tell wakes no thread, unless a slot is now sure to free at
            # the next step: the desk then takes a job for it while that step runs.
            if told or (decoder is not None and decoder.freed_next_step > freeing):
                with box.wake:
                    box.wake.notify_all()
            if failed:
                self._refuse_waiting("decoding failed beside it")
                return True

    def _take_ready(self, decoder: BatchDecoder | None) -> list[Prepared] | None:
        """What the desk readied (after a short wait when there is nothing to step); None
        when the run is over: the desk is done and nothing is live, or the desk broke."""
        box = self._box
        with box.wake:
            if box.desk_error is not None:  # nobody would settle what the sequences produce
                if decoder is not None:
                    decoder.abandon()
                return None
            ready = list(box.ready)
            box.ready.clear()
            if not ready and (decoder is None or not decoder.active):
                if box.desk_done:
                    return None
                box.wake.wait(INTAKE_POLL_S)
        return ready

    def _admit(self, ready: list[Prepared]) -> tuple[list[tuple[str, int, int]], list[tuple[str, str]]]:
        """Ready requests into free slots; those without room yet wait in front."""
        admitted, refused, waiting = [], [], []
        for prepared in ready:
            decoder = prepared.decoder
            if prepared.n > decoder.slots:
                refused.append(
                    (prepared.key, f"{prepared.n} samples need {prepared.n} slots; this worker has {decoder.slots}")
                )
                continue
            if decoder.free_slots_for(prepared.priority) < prepared.n:
                self._make_room(decoder, prepared)
            if decoder.free_slots_for(prepared.priority) < prepared.n:  # taken while a slot was ending
                waiting.append(prepared)
                continue
            try:
                cached = prepared.admit()
            except ValueError as exc:
                refused.append((prepared.key, str(exc)))
                continue
            admitted.append((prepared.key, cached, decoder.tokens_decoded))
        if waiting:
            with self._box.wake:
                self._box.ready.extendleft(reversed(waiting))
        return admitted, refused

    @staticmethod
    def _make_room(decoder: BatchDecoder, prepared: Prepared) -> None:
        """Parks less urgent decoding sequences for the request when the streams it needs are
        not free now nor sure to free at the next step, and parking can give them all."""
        need = prepared.n - decoder.free_slots_for(prepared.priority) - decoder.freed_next_step
        if need > 0 and decoder.parkable(prepared.priority) >= need:
            decoder.park_for(prepared.priority, need)

    def _refuse_waiting(self, why: str) -> None:
        with self._box.wake:
            ready = list(self._box.ready)
            self._box.ready.clear()
            self._box.closed = True
        self._box.outputs.put(_Output(refused=tuple((p.key, why) for p in ready)))


class _Desk:
    """The run's side thread: intake, publishing and settling (see the module's docstring)."""

    def __init__(self, host: Host, box: _Mailbox, model: str, kind: str) -> None:
        self._host = host
        self._box = box
        self._model = model
        self._kind = kind
        self._jobs: dict[str, Started] = {}  # every job of the run not yet settled
        self._unadmitted: dict[str, int] = {}  # handed to the engine, not admitted yet: slots each needs
        self._ended: deque[Finished] = deque()  # ended in the engine, not settled yet
        self._decoder: BatchDecoder | None = None
        self._polled_at = float("-inf")
        self._peeked_at = float("-inf")  # with every slot taken: when it last looked for a more urgent job

    def run(self, job: Job, queue: Queue) -> None:
        try:
            self._box.closed = self._host.must_run_alone(job)
            self._take(job, queue)
            while True:
                if self._box.engine_error is not None:
                    self._fail_all(self._box.engine_error)
                    return
                self._drain_outputs()
                self._take_more()
                self._settle_ended()
                if self._finished():
                    return
                with self._box.wake:
                    if self._box.outputs.empty():
                        self._box.wake.wait(INTAKE_POLL_S)
        except BaseException as exc:
            # A defect here (not an outcome: those are settled in order). The jobs in hand must
            # not stay running, heartbeat by the monitor, until the worker dies.
            log.exception("the desk of a generation run failed")
            self._broke(exc)
        finally:
            with self._box.wake:
                self._box.closed = self._box.desk_done = True
                self._box.wake.notify_all()

    def _fail_all(self, why: str) -> None:
        """Every job of the run not settled yet fails with the reason (what the engine did
        produce is settled first)."""
        self._drain_outputs()
        self._settle_ended()
        for key in list(self._jobs):
            self._host.runner.refuse(key, why)
            self._settled(key)

    def _broke(self, exc: BaseException) -> None:
        """Stops the engine, then fails every job in hand (what the engine had produced is
        settled first where that still works)."""
        box = self._box
        with box.wake:
            box.desk_error = exc
            box.wake.notify_all()
            while not box.engine_stopped:
                box.wake.wait()
        why = f"the worker's desk failed: {type(exc).__name__}: {exc}"
        try:
            self._drain_outputs()
            self._settle_ended()
        except Exception:
            log.exception("the engine's last outputs could not be settled")
        for key, started in list(self._jobs.items()):
            try:
                self._host.runner.refuse(key, why)
            except Exception:
                # No outcome written: RQ's failed registry keeps the trace and the reconciler
                # enqueues the job again (its row is running where nothing runs it).
                log.exception("job %s could not be failed", key)
                self._jobs.pop(key)
                self._host.fail(started.job, started.queue, started.execution)
            else:
                self._settled(key)

    def _finished(self) -> bool:
        """Done once nothing is live or in hand and nothing more will be taken."""
        if self._jobs:
            return False
        return not (self._may_take() and self._take_one_now())

    # ------------------------------------------------------------- intake

    def _may_take(self) -> bool:
        return not self._box.closed and self._host.may_take_more()

    def _free(self) -> int:
        """Slots for more jobs: those free now and those the step under way frees (a sequence
        at its length limit), less those of the requests handed over and not admitted yet. A
        job taken for a slot still ending is admitted the moment it frees, not a step later."""
        decoder = self._decoder
        if decoder is None:
            return 0
        return decoder.free_slots + decoder.freed_next_step - sum(self._unadmitted.values())

    def _take_more(self) -> None:
        if self._free() <= 0:
            self._take_urgent()
            return
        if time.monotonic() - self._polled_at < INTAKE_POLL_S or not self._may_take():
            return
        self._polled_at = time.monotonic()
        while self._free() > 0 and self._may_take() and self._take_one_now():
            self._polled_at = float("-inf")  # a job came: look again at once while slots are free

    def _take_urgent(self) -> None:
        """Every slot taken: the next waiting job of this model is taken all the same when it
        outranks the least urgent job in hand (the engine parks for it), one at a time."""
        if time.monotonic() - self._peeked_at < INTAKE_POLL_S or not self._host.preemption:
            return
        if self._unadmitted or not self._jobs or not self._may_take():
            return
        self._peeked_at = time.monotonic()
        waiting = self._host.waiting_priority(self._model, self._kind)
        least_urgent = max(started.claimed.priority for started in self._jobs.values())
        if waiting is not None and waiting < least_urgent:
            self._take_one_now()

    def _take_one_now(self) -> bool:
        """Takes the next waiting job of this model if it is the most urgent; False if none."""
        host = self._host
        taken = host.next_waiting(self._model, self._kind)
        if taken is None:
            return False
        job, queue = taken
        if job.id in self._jobs or host.must_run_alone(job):
            # An admin requeued a job still running here (its old run ends at the next step),
            # or the job must run alone: it waits in front until this run ends.
            host.put_back(job, queue)
            self._box.closed = job.id not in self._jobs
            return False
        return self._take(job, queue)

    def _take(self, job: Job, queue: Queue) -> bool:
        started = self._host.start(job, queue)
        if started is None:
            return False
        deadline = time.monotonic() + self._host.job_timeout_s
        try:
            prepared = self._host.runner.prepare_generation(started.claimed, started.cancel, deadline)
        except Exception:
            log.exception("job %s could not be started", job.id)
            self._host.fail(job, queue, started.execution)
            return False
        if prepared is None:  # it ended at once (failed, handed back)
            self._host.end(job, started.execution)
            return False
        self._decoder = prepared.decoder
        self._jobs[job.id] = started
        self._unadmitted[job.id] = prepared.n
        with self._box.wake:
            self._box.ready.append(prepared)
            self._box.wake.notify_all()
        log.info("%s: %s (%d in this run)", queue.name, job.id, len(self._jobs))
        return True

    # ------------------------------------------------------------- what the engine produced

    def _drain_outputs(self) -> None:
        runner = self._host.runner
        while True:
            try:
                output = self._box.outputs.get_nowait()
            except queues.Empty:
                return
            for key, cached, decoded in output.admitted:
                self._unadmitted.pop(key, None)
                runner.admitted(key, cached, decoded)
            for key, why in output.refused:
                self._unadmitted.pop(key, None)
                runner.refuse(key, why)
                self._settled(key)
            runner.publish_pieces(list(output.pieces), ended=bool(output.finished))
            self._ended.extend(output.finished)

    def _settle_ended(self) -> None:
        """Outcomes to the writer and RQ's bookkeeping of the requests that ended. The desk does
        it after taking the jobs for the slots they freed: the writer's commit would otherwise
        race the next claim for the database (SQLite's one writer), and the engine would wait
        for both before its next admission."""
        runner = self._host.runner
        while self._ended:
            done = self._ended.popleft()
            runner.finish_generation(done)
            self._settled(done.key)

    def _settled(self, key: str) -> None:
        started = self._jobs.pop(key)
        self._host.end(started.job, started.execution)


class EmbeddingRun:
    """Several queued embedding jobs of one model, their texts embedded together.

    Taken the way a generation run admits (the first non-empty queue in the worker's order
    must be this model's embedding queue), so priorities hold; each job keeps its claim, RQ
    execution and outcome."""

    MAX_JOBS = 32  # a batch's job holds up to 64 texts: at most ~2,000 texts in one run

    def __init__(self, host: Host, queue: Queue, model: str, kind: str) -> None:
        self._host = host
        self._queue = queue
        self._model = model
        self._kind = kind

    def run(self, job: Job) -> None:
        started = self._start(self._take_waiting(job))
        if not started:
            return
        if len(started) > 1:
            log.info("embedding %d jobs of %s together", len(started), self._model)
        self._host.runner.run_embeddings([(each.claimed, each.cancel) for each in started])
        for each in started:
            self._host.end(each.job, each.execution)

    def _take_waiting(self, job: Job) -> list[tuple[Job, Queue]]:
        """The job, and the waiting jobs of its model next in the worker's order."""
        host = self._host
        taken = [(job, self._queue)]
        if host.must_run_alone(job):
            return taken
        while host.may_take_more() and len(taken) < self.MAX_JOBS:
            more = host.next_waiting(self._model, self._kind)
            if more is None:
                break
            if host.must_run_alone(more[0]):  # it runs next, by itself
                host.put_back(*more)
                break
            taken.append(more)
        return taken

    def _start(self, taken: list[tuple[Job, Queue]]) -> list[Started]:
        """Each taken job claimed and started; if the database goes away meanwhile, those not
        started yet go back to the front of their queues, in their order."""
        started = []
        for i, (each, queue) in enumerate(taken):
            if i > 0 and not self._host.may_take_more():
                for back, back_queue in reversed(taken[i:]):
                    self._host.put_back(back, back_queue)
                break
            begun = self._host.start(each, queue)
            if begun is not None:
                started.append(begun)
        return started
