"""A batch's queue order, planned as its jobs are made (``gpuq.batches.planning`` says how).

Applies to every batch whatever made it (``/v1/batches``, Anthropic's Message Batches, a cron
run): they all start in ``service.start_batch``, which hands each generation line to
:meth:`QueueOrder.note` as it makes the line's job, and asks :meth:`QueueOrder.order` for the
queue order once every job is made.

- **What a line starts with** (:func:`prompt_bytes`): its prompt's text, its messages (tools
  first, then each message's role and content, in the order a chat template renders them), or
  its token ids. No template is rendered and nothing is tokenised: a few microseconds a line.
- **Slots**: those of the workers that serve the model, all together (the workers with it
  loaded, else every live worker), else the default of ``GPUQ_WORKER_SLOTS`` (no worker is up
  yet: a cron run at night, say).
- **Lanes**: with prefix-aware placement on, the groups of lines that share a start go to the
  lanes of the live workers serving the model, spread by prompt bytes
  (``gpuq.batches.lane_split``), each lane in the planned order; a group whose start a worker
  already holds goes to that worker while its share allows. Finding the holder takes the
  group's first line tokenised (as the API tokenises a single request): one line a group, at
  most ``MAX_STARTS`` starts a batch.
- **What changes**: only the order jobs are queued in (and, with lanes, the queues). Job ids, line numbers, and so the
  results file, follow the file. Embedding lines are queued in file order, after the planned
  lines (they have queues of their own).
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuq.batches.lane_split import MIN_SHARED_BLOCKS, Holders, spread
from gpuq.batches.planning import KEY_BYTES, Plan, PlannedLine, plan, plan_chain
from gpuq.fleet.workers import LiveWorker
from gpuq.jobs.generation_params import GenerationParams
from gpuq.jobs.prefix_routing import OFF, PrefixRouting, routing_of
from gpuq.queue_names import QueueEntry, is_valid_lane
from gpuq.settings import DEFAULT_CPU_SLOTS, DEFAULT_GPU_SLOTS, Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Planning:
    """What planning needs from the settings."""

    enabled: bool = True  # GPUQ_BATCH_PLAN; false: file order
    routing: PrefixRouting = OFF  # GPUQ_PREFIX_ROUTING: groups of lines sharing a start go to workers' lanes
    gpu_slots: int = DEFAULT_GPU_SLOTS  # slots when no live worker says its own, on a fleet of GPUs
    cpu_slots: int = DEFAULT_CPU_SLOTS  # ... and on one without

    @classmethod
    def of(cls, settings: Settings) -> Planning:
        return cls(
            enabled=settings.batch_plan,
            routing=routing_of(settings),
            gpu_slots=settings.slots_for(on_gpu=True),
            cpu_slots=settings.slots_for(on_gpu=False),
        )


@dataclass(frozen=True, slots=True)
class PlanFigures:
    """What a batch's plan did, all its models together (kept on the batch's row)."""

    lines: int
    groups: int
    slots: int
    prompt_bytes: int
    shared_bytes: int


def prompt_bytes(params: GenerationParams) -> bytes:
    """What a generation request's prompt starts with, as bytes that two requests share the
    start of where their rendered prompts share theirs."""
    if params.prompt_token_ids is not None:
        return struct.pack(f"<{len(params.prompt_token_ids)}i", *params.prompt_token_ids)
    if params.messages is None:
        return (params.prompt or "").encode()
    parts = [json.dumps(params.tools).encode()] if params.tools else []
    for message in params.messages:
        parts += [message.role.encode(), message.content.encode()]
        if message.tool_calls:
            parts.append(json.dumps(message.tool_calls).encode())
    return b"\0".join(parts)


# The workers of ``workers`` (by name) holding the start of each request of ``model`` (None for
# none, or where the request is None): ``service.start_batch`` looks them up in the workers'
# prefix index (``gpuq.jobs.prefix_routing.holders``).
HeldStarts = Callable[[str, list[GenerationParams | None], list[str]], list[str | None]]

# A group's start is looked up by the request of its first line, or of the first line that began
# as it does for START_KEY_BLOCKS blocks (1 KB: deeper than a system prompt all lines share, so
# two families under one system prompt are told apart): one request kept per such start, at most
# MAX_STARTS of them (a batch of distinct prompts keeps no more).
START_KEY_BLOCKS = 8
MAX_STARTS = 256


class QueueOrder:
    """One batch's planning: its generation lines' chains, gathered as its jobs are made."""

    def __init__(self, planning: Planning, *, on_gpu: bool) -> None:
        self._default_slots = planning.gpu_slots if on_gpu else planning.cpu_slots
        self._lanes = planning.routing.on
        self._models: dict[str, list[PlannedLine]] = {}
        self._starts: dict[tuple[str, bytes], GenerationParams] = {}

    def note(self, model: str, line_number: int, params: GenerationParams) -> None:
        """A generation line of ``model``, its job just made."""
        prompt = prompt_bytes(params)
        chain = plan_chain(prompt)
        self._models.setdefault(model, []).append(PlannedLine(line_number, chain, len(prompt)))
        if self._lanes and len(chain) >= MIN_SHARED_BLOCKS * KEY_BYTES and len(self._starts) < MAX_STARTS:
            self._starts.setdefault((model, chain[: START_KEY_BLOCKS * KEY_BYTES]), params)

    def order(
        self, queued: Iterable[tuple[int, QueueEntry]], workers: list[LiveWorker], held: HeldStarts | None = None
    ) -> tuple[list[QueueEntry], PlanFigures | None]:
        """The queue order of the batch's entries (``queued``: each with its first input
        line), for the live ``workers``, and what the plan did (None when nothing was planned).
        With lanes, ``held`` says which workers hold the starts of the groups of lines."""
        by_line = sorted(queued, key=lambda q: q[0])
        if not self._models:
            return [entry for _line, entry in by_line], None
        plans: list[Plan] = [
            plan(lines, slots=_slots(model, workers, self._default_slots)) for model, lines in self._models.items()
        ]
        entry_of = dict(by_line)
        if self._lanes:
            for model, lines in self._models.items():
                serving = [
                    w.name
                    for w in workers
                    if not w.drain_requested and model in (w.generates or ()) and is_valid_lane(w.name)
                ]
                for line, lane in spread(lines, serving, self._holders(model, serving, held)).items():
                    entry_of[line] = entry_of[line]._replace(lane=lane)
        first = [entry_of.pop(line) for p in plans for line in p.order]
        rest = [entry for line, entry in by_line if line in entry_of]  # embeddings
        figures = PlanFigures(
            lines=sum(p.lines for p in plans),
            groups=sum(p.groups for p in plans),
            slots=max(p.slots for p in plans),
            prompt_bytes=sum(p.prompt_bytes for p in plans),
            shared_bytes=sum(p.shared_bytes for p in plans),
        )
        return first + rest, figures

    def _holders(self, model: str, serving: list[str], held: HeldStarts | None) -> Holders | None:
        if held is None:
            return None

        def holders(groups: list[list[PlannedLine]]) -> list[str | None]:
            starts = [self._starts.get((model, g[0].chain[: START_KEY_BLOCKS * KEY_BYTES])) for g in groups]
            return held(model, starts, serving)

        return holders


def _slots(model: str, workers: list[LiveWorker], default: int) -> int:
    """The slots of the workers that serve ``model``, all together: those with it loaded, else
    every live one (each may load it), else the default."""
    serving = [w.slots for w in workers if model in w.loaded_models] or [w.slots for w in workers]
    return sum(serving) or default
