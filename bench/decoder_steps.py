"""What a decoder step costs the engine itself, early in an answer and 2,000 tokens in.

A step is one ``llama_decode`` plus the engine's own work: planning, sampling, the text and
its stop strings. Before, each token detokenised the whole completion and rescanned it for
stop strings, so long answers got slower every token (9 ms a sequence a step at 1,000 tokens,
23 ms at 2,000); now each token's bytes are appended once and stop strings are looked for
only where they can newly end. Measured on K sequences generating 2,050 tokens each, greedy,
with two stop strings that never occur: the engine's own time a step (the step's wall time
less the time inside llama_decode, which itself grows with the context) around token 50 and
around token 2,000. Beside it, on the same tokens, what the old text handling cost a step.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from statistics import median

from gpuq.jobs.generation_params import GenerationParams
from gpuq.registry.bundled import require_bundled_model_path
from worker.engine import LoadedModel

PROMPT = "Count from 1 to 5000: 1, 2, 3,"  # SmolLM2 counts on, greedy, until max_tokens
LENGTH = 2050
STOPS = ["<|never|>", "THE END OF ALL THINGS"]
WINDOW = 20  # steps on each side of a measuring point


@dataclass(frozen=True)
class StepCosts:
    slots: int
    own_ms_at_50: float
    own_ms_at_2000: float
    decode_ms_at_50: float
    decode_ms_at_2000: float
    old_text_ms_at_50: float
    old_text_ms_at_2000: float


def run(*, slots: int, threads: int) -> StepCosts:
    model = LoadedModel(
        str(require_bundled_model_path()), n_ctx=2304, embedding=False, threads=threads, gpu_layers=0, slots=slots
    )
    decoder = model.decoder
    assert decoder is not None
    request = {"prompt": PROMPT, "max_tokens": LENGTH, "temperature": 0.0, "stop": STOPS}
    for i in range(slots):
        model.prepare(f"s{i}", GenerationParams.model_validate(request | {"seed": i}), threading.Event()).admit()
    own: list[float] = []
    decode: list[float] = []
    while decoder.active:
        before_decode, started = decoder.decode_seconds, time.perf_counter()
        decoder.step()
        wall = time.perf_counter() - started
        spent = decoder.decode_seconds - before_decode
        own.append((wall - spent) * 1000)
        decode.append(spent * 1000)
    tokens = model.prompt_tokens(GenerationParams(prompt=PROMPT))
    model.close()
    completion = _completion_tokens(model_path=str(require_bundled_model_path()), prompt_tokens=tokens)
    return StepCosts(
        slots,
        median(own[50 - WINDOW : 50 + WINDOW]),
        median(own[2000 - WINDOW : 2000 + WINDOW]),
        median(decode[50 - WINDOW : 50 + WINDOW]),
        median(decode[2000 - WINDOW : 2000 + WINDOW]),
        _old_text_ms(completion[:50], slots),
        _old_text_ms(completion[:2000], slots),
    )


def _completion_tokens(*, model_path: str, prompt_tokens: list[int]) -> list[int]:
    """The greedy answer's tokens, for timing the old text handling on them."""
    model = LoadedModel(model_path, n_ctx=2304, embedding=False, threads=2, gpu_layers=0, slots=1)
    request = {"prompt": PROMPT, "max_tokens": LENGTH, "temperature": 0.0, "stop": []}
    model.prepare("one", GenerationParams.model_validate(request), threading.Event()).admit()
    assert model.decoder is not None
    while True:
        for finished in model.decoder.step():
            model.close()
            assert finished.generation is not None
            return list(finished.generation.token_ids)


def _old_text_ms(tokens: list[int], slots: int) -> float:
    """One step of the old handling for ``slots`` sequences ``len(tokens)`` tokens in: the whole
    completion detokenised and scanned for each stop string."""
    import llama_cpp
    from llama_cpp._internals import LlamaModel

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    vocab = LlamaModel(path_model=str(require_bundled_model_path()), params=params, verbose=False)
    stops = [s.encode() for s in STOPS]
    times = []
    for _ in range(WINDOW):
        started = time.perf_counter()
        for _seq in range(slots):
            text = vocab.detokenize(tokens)
            _ = [s for s in stops if s in text]
        times.append((time.perf_counter() - started) * 1000)
    vocab.close()
    return median(times)
