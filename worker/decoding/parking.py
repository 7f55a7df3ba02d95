"""Preemption by priority: a decoding sequence parked for a more urgent request, and resumed
later exactly where it stopped.

When a request waits that outranks a decoding sequence and no stream is free, the least
urgent decoding sequence (the newest among equals) gives its stream up: its cells, positions
``[0, position)`` (its prompt and every completion token but the one sampled last, not yet
decoded), are saved to host memory (``kv_state.py``), and it keeps everything else as it was:
its sampler chain (the RNG's state, a grammar's), its text, its pending token. Its stream is
free, still holding its prompt's reusable tokens for any prompt that shares them.

Once a stream is free again, and before any request as urgent as it or less is admitted
(``BatchDecoder.free_slots`` counts parked sequences as taken), it resumes: its cells restored
into the lowest free stream, bit for bit, and its pending token decoded at its position as it
would have been. Its text is the one it gives never parked (tests/worker/decoding/
test_parking.py). Streamed text is never lost: what was handed out stays handed out, what was
held back (a possible stop string) stays held in its text.

A sequence is parked at most ``MAX_PARKS`` times, so a stream of urgent work cannot starve
it; its request stays admitted all along (its job still running, not requeued, no attempt
charged), and its ``parks`` and ``parked_ms`` are reported with its generation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from worker.decoding.batch_runner import BatchRunner
from worker.decoding.kv_streams import KvOp, KvStreams
from worker.decoding.sequences import Sequence, Sequences, State

MAX_PARKS = 2


class Parking:
    def __init__(
        self, runner: BatchRunner, kv: KvStreams, seqs: Sequences, apply: Callable[[Iterable[KvOp]], None]
    ) -> None:
        self._runner = runner
        self._kv = kv
        self._seqs = seqs
        self._apply = apply  # the decoder's: KvStreams's operations, saves included
        self.parks = 0
        self.resumes = 0

    def victims(self, priority: int) -> list[Sequence]:
        """The decoding sequences a request of ``priority`` may take a stream from, in the
        order they would go: the least urgent first, the newest first among equals."""
        candidates = [
            s
            for s in self._seqs.live.values()
            if s.state is State.DECODING and s.request.priority > priority and s.parks < MAX_PARKS
        ]
        return sorted(candidates, key=lambda s: (s.request.priority, s.request.admitted, s.index), reverse=True)

    def park_for(self, priority: int, streams: int) -> int:
        """Parks up to ``streams`` sequences less urgent than ``priority``; how many it parked."""
        parked = 0
        for seq in self.victims(priority):
            if parked == streams:
                break
            parked += self._park(seq)
        return parked

    def _park(self, seq: Sequence) -> bool:
        stream = self._kv.stream_of(seq.id)
        cells = self._runner.save(stream, keep=seq.position)
        if cells is None:  # a copy into it is not applied yet: another victim, or wait
            return False
        seq.parked_cells = cells
        seq.parked_reusable = self._kv.park(seq.id)
        seq.parked_since = time.perf_counter()
        seq.parks += 1
        self._seqs.park(seq)
        self.parks += 1
        return True

    def resume_waiting(self) -> list[Sequence]:
        """Parked sequences back into free streams, the most urgent and oldest first; those
        whose cells llama.cpp refused (never expected: the same context) are returned, to be
        failed by the caller."""
        lost = []
        order = sorted(self._seqs.parked.values(), key=lambda s: (s.request.priority, s.request.admitted, s.index))
        for seq in order:
            if self._kv.free - len(self._seqs.waiting) <= 0:
                break
            if self._runner.copy_pending(self._kv.lowest_free()):
                break  # at the next step
            if not self._resume(seq):
                lost.append(seq)
        return lost

    def _resume(self, seq: Sequence) -> bool:
        placement = self._kv.resume(seq.id, seq.parked_reusable, seq.request.scope)
        self._apply(placement.ops)
        assert seq.parked_cells is not None and seq.parked_since is not None
        ok = self._runner.restore(placement.stream, seq.parked_cells, keep=seq.position)
        seq.parked_s += time.perf_counter() - seq.parked_since
        seq.parked_cells, seq.parked_since = None, None
        self._seqs.resume(seq)
        self.resumes += ok
        return ok
