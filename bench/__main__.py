"""Benchmarks, each against its baseline in the same run. `python -m bench --help`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from statistics import median

from bench import (
    admission,
    batch_bench,
    batch_plan,
    batch_start,
    batching,
    db_growth,
    decoder_steps,
    dispatch,
    fairness,
    fleet_prefix,
    generation,
    intake_burst,
    invariance,
    model_swap,
    peer,
    preempt,
    restore,
    scoring,
    soak,
    stats_bench,
    streaming,
    structured,
    upload_line,
    worker_memory,
)
from bench.system import fresh_system_state

DEFAULT_REDIS = "redis://127.0.0.1:6379/11"
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"


def bench_dispatch(args: argparse.Namespace) -> None:
    rq_runs, gpuq_runs = [], []
    for _ in range(args.rounds):
        with fresh_system_state(args.redis_url, None) as (redis_url, _db, _dir):
            rq_runs.append(dispatch.run_plain_rq(redis_url, args.jobs).jobs_per_s)
        with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
            gpuq_runs.append(dispatch.run_gpuq(db, redis_url, workdir, args.jobs).jobs_per_s)
    rq, ours = median(rq_runs), median(gpuq_runs)
    print(f"\ndispatch overhead: {args.jobs} no-op jobs, one worker, median of {args.rounds} rounds")
    print(f"  plain RQ SimpleWorker  {rq:8.0f} jobs/s   runs: {', '.join(f'{r:.0f}' for r in rq_runs)}")
    print(f"  gpuq (HTTP+SQL+RQ)     {ours:8.0f} jobs/s   runs: {', '.join(f'{r:.0f}' for r in gpuq_runs)}")
    print(f"  ratio gpuq / RQ        {ours / rq:8.2f}x   (target >= 1.0x)")


def bench_generation(args: argparse.Namespace) -> None:
    direct_runs, gpuq_runs = [], []
    for _ in range(args.rounds):
        direct_runs.append(generation.run_direct(threads=args.threads, max_tokens=args.max_tokens))
        with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
            gpuq_runs.append(
                generation.run_gpuq(db, redis_url, workdir, threads=args.threads, max_tokens=args.max_tokens)
            )
    for d, g in zip(direct_runs, gpuq_runs, strict=True):
        assert d.completion_tokens == g.completion_tokens, "both sides must generate the same tokens"
    direct = median(r.tokens_per_s for r in direct_runs)
    ours = median(r.tokens_per_s for r in gpuq_runs)
    tokens = direct_runs[0].completion_tokens
    print(
        f"\ngeneration overhead: {len(generation.PROMPTS)} jobs, {tokens} tokens, {args.threads} threads, "
        f"median of {args.rounds} rounds"
    )
    print(
        f"  llama-cpp-python direct  {direct:7.1f} tokens/s   runs: "
        f"{', '.join(f'{r.tokens_per_s:.1f}' for r in direct_runs)}"
    )
    print(
        f"  gpuq (HTTP+queue+SQL)    {ours:7.1f} tokens/s   runs: "
        f"{', '.join(f'{r.tokens_per_s:.1f}' for r in gpuq_runs)}"
    )
    print(f"  ratio gpuq / direct      {ours / direct:7.3f}x   (target >= 0.97x)")


def bench_streaming(args: argparse.Namespace) -> None:
    """Interleaved rounds, so a slower patch of the host hits every side."""
    names = {False: "each prompt evaluated whole", True: "prompt reuse on both sides (gpuq's default)"}
    runs: dict[str, tuple[list[streaming.Run], list[streaming.Run]]] = {name: ([], []) for name in names.values()}
    apis: dict[str, list[streaming.Run]] = {api: [] for api in streaming.APIS}  # each prompt whole
    for round_ in range(1, args.rounds + 1):
        for reuse, name in names.items():
            direct, ours = runs[name]
            direct.append(streaming.run_direct(threads=args.threads, max_tokens=args.max_tokens, reuse=reuse))
            with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
                by_api = streaming.run_gpuq(
                    db, redis_url, workdir, threads=args.threads, max_tokens=args.max_tokens, reuse=reuse
                )
            ours.append(by_api[streaming.CHAT])
            if streaming.RESPONSES in by_api:
                for api, run in by_api.items():
                    apis[api].append(run)
            print(
                f"round {round_}, {name}: direct {direct[-1].seconds:.1f} s, gpuq {ours[-1].seconds:.1f} s", flush=True
            )
    print(streaming.report(runs, threads=args.threads, max_tokens=args.max_tokens))
    chat = apis.pop(streaming.CHAT)
    print(
        streaming.report_apis(
            chat, {"/v1/responses": apis[streaming.RESPONSES], "/v1/messages": apis[streaming.MESSAGES]}
        )
    )


def bench_batching(args: argparse.Namespace) -> None:
    """Interleaved rounds: every side once per round, so a slower patch of the host hits all."""
    seq: list[batching.Run] = []
    direct: dict[int, list[batching.Run]] = {k: [] for k in args.slots}
    ours: dict[int, list[batching.Run]] = {k: [] for k in args.slots}
    cached: list[batching.Run] = []  # gpuq at K=1 with prompt reuse off
    for round_ in range(1, args.rounds + 1):
        seq.append(batching.run_sequential(threads=args.threads, max_tokens=args.max_tokens))
        print(f"round {round_}: sequential {seq[-1].tokens_per_s:.1f} tok/s", flush=True)
        for k in args.slots:
            direct[k].append(batching.run_direct_batched(slots=k, threads=args.threads, max_tokens=args.max_tokens))
            with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
                ours[k].append(
                    batching.run_gpuq(db, redis_url, workdir, slots=k, threads=args.threads, max_tokens=args.max_tokens)
                )
            d, g = direct[k][-1].tokens_per_s, ours[k][-1].tokens_per_s
            print(f"round {round_}: K={k} direct {d:.1f}, gpuq {g:.1f} tok/s", flush=True)
        if 1 in args.slots:
            with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
                run = batching.run_gpuq(
                    db,
                    redis_url,
                    workdir,
                    slots=1,
                    threads=args.threads,
                    max_tokens=args.max_tokens,
                    prompt_cache=False,
                )
                cached.append(run)
            print(f"round {round_}: K=1 gpuq with reuse off {cached[-1].tokens_per_s:.1f} tok/s", flush=True)

    def tps(runs: list[batching.Run]) -> float:
        return median(r.tokens_per_s for r in runs)

    def lat(runs: list[batching.Run], pct: int) -> float:
        return median(r.latency(pct) for r in runs)

    print(
        f"\ncontinuous batching: {len(batching.PROMPTS)} jobs, max_tokens {args.max_tokens}, greedy, "
        f"{args.threads} threads, median of {args.rounds} rounds (tokens/s; job latency p50/p95 in s)"
    )
    print(f"  sequential create_completion   {tps(seq):7.1f} tok/s   p50 {lat(seq, 50):6.1f}  p95 {lat(seq, 95):6.1f}")
    for k in args.slots:
        print(
            f"  K={k:<2} direct batched          {tps(direct[k]):7.1f} tok/s   "
            f"p50 {lat(direct[k], 50):6.1f}  p95 {lat(direct[k], 95):6.1f}"
        )
        print(
            f"  K={k:<2} gpuq                    {tps(ours[k]):7.1f} tok/s   "
            f"p50 {lat(ours[k], 50):6.1f}  p95 {lat(ours[k], 95):6.1f}   "
            f"gpuq/direct {tps(ours[k]) / tps(direct[k]):5.2f}x"
        )
    if 1 in ours:
        print(
            f"  K=1  gpuq, reuse off           {tps(cached):7.1f} tok/s   "
            f"p50 {lat(cached, 50):6.1f}  p95 {lat(cached, 95):6.1f}"
        )
        print(f"  gpuq K=1 / sequential          {tps(ours[1]) / tps(seq):7.3f}x   (target >= 0.97x)")
        print(f"  gpuq K=1, reuse off / seq.     {tps(cached) / tps(seq):7.3f}x")
    if 1 in ours and 8 in ours:
        ceiling, scaling = tps(ours[8]) / tps(direct[8]), tps(ours[8]) / tps(ours[1])
        print(f"batching: K=8 gpuq/direct {ceiling:.2f}x, gpuq K=8/K=1 {scaling:.2f}x")


def bench_model_swap(args: argparse.Namespace) -> None:
    fifo, ours = [], []
    for _ in range(args.rounds):
        with fresh_system_state(args.redis_url, None) as (redis_url, _db, _dir):
            fifo.append(model_swap.run_fifo(redis_url))
        with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
            ours.append(model_swap.run_gpuq(db, redis_url, workdir))
    fifo_s, ours_s = median(r.makespan_s for r in fifo), median(r.makespan_s for r in ours)
    minimum = len(model_swap.MODELS)
    print(
        f"\nmodel swap: {model_swap.JOBS} jobs A B C A B C..., 3 models, 2 workers with room for one model each, "
        f"median of {args.rounds} rounds"
    )
    print(f"  plain RQ, FIFO       makespan {fifo_s:6.2f} s   loads {', '.join(str(r.loads) for r in fifo)}")
    print(f"  gpuq, sticky         makespan {ours_s:6.2f} s   loads {', '.join(str(r.loads) for r in ours)}")
    print(
        f"  makespan ratio       {ours_s / fifo_s:6.2f}x   (target <= 0.5x); minimum loads {minimum}, "
        f"gpuq's worst {max(r.loads for r in ours)} (target <= {2 * minimum})"
    )


def bench_batch_accept(args: argparse.Namespace) -> None:
    ours, bare = [], []
    for _ in range(args.rounds):
        with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
            bare.append(batch_bench.accept_bare(db, redis_url, args.batch_lines).seconds)
        with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
            ours.append(batch_bench.accept_gpuq(db, redis_url, workdir, args.batch_lines).seconds)
    print(f"\nbatch accept: {args.batch_lines} lines, median of {args.rounds} rounds")
    print(f"  bare bulk SQL insert + Redis pipeline  {median(bare):6.2f} s   runs: {_fmt(bare)}")
    print(f"  gpuq upload + check + batch + queue    {median(ours):6.2f} s   runs: {_fmt(ours)}")
    print(f"  ratio gpuq / bare                      {median(ours) / median(bare):6.2f}x   (target <= 2x)")


def bench_batch_start(args: argparse.Namespace) -> None:
    """The API's memory and time starting a batch of ~4 KB lines, at each of --start-lines."""
    costs = []
    for lines in args.start_lines:
        with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
            costs.append(batch_start.measure(db, redis_url, workdir, lines))
    print(f"\nbatch start: chat lines of ~{batch_start.LINE_BYTES} bytes, the API's resident memory in MiB")
    for c in costs:
        print(
            f"  {c.lines:>6} lines  {c.seconds:7.1f} s ({c.seconds_per_10k:5.1f} s per 10k)  memory before "
            f"{c.rss_before_mib:6.0f}, peak {c.rss_peak_mib:6.0f}, after {c.rss_after_mib:6.0f} "
            f"({c.after_over_before:.2f}x; target <= 1.2x)"
        )
    if len(costs) > 1:
        growth = costs[-1].seconds_per_10k / costs[0].seconds_per_10k
        largest, smallest = costs[-1].lines, costs[0].lines
        print(f"batch-start: time per line at {largest} / at {smallest} lines {growth:.2f}x (linear: ~1x)")


def bench_message_batch_start(args: argparse.Namespace) -> None:
    """The API's memory and time accepting a Message Batch of ~4 KB requests, at each of --start-lines."""
    costs = []
    for count in args.start_lines:
        with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
            costs.append(batch_start.measure_messages(db, redis_url, workdir, count))
    print(
        f"\nmessage batch start: inline requests of ~{batch_start.LINE_BYTES} bytes, the API's resident memory in MiB"
    )
    for c in costs:
        print(
            f"  {c.lines:>6} requests  {c.seconds:7.1f} s ({c.seconds_per_10k:5.1f} s per 10k)  memory before "
            f"{c.rss_before_mib:6.0f}, peak {c.rss_peak_mib:6.0f}, after {c.rss_after_mib:6.0f} "
            f"({c.after_over_before:.2f}x; target <= 1.2x)"
        )


def bench_embeddings(args: argparse.Namespace) -> None:
    texts = [batch_bench.text(i) for i in range(args.embed_texts)]
    direct: list[float] = []
    grouped: list[float] = []
    single: list[float] = []
    for _ in range(args.rounds):
        direct.append(batch_bench.embed_direct(texts, args.threads).texts_per_s)
        for results, is_grouped in ((grouped, True), (single, False)):
            with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
                results.append(
                    batch_bench.embed_gpuq(db, redis_url, workdir, texts, args.threads, grouped=is_grouped).texts_per_s
                )
    print(
        f"\nembedding throughput: {args.embed_texts} one-text lines, {args.threads} threads, "
        f"median of {args.rounds} rounds"
    )
    print(f"  llama-cpp-python embed(list), one call   {median(direct):7.1f} texts/s   runs: {_fmt(direct)}")
    print(f"  gpuq batch, 64 texts per job            {median(grouped):7.1f} texts/s   runs: {_fmt(grouped)}")
    print(f"  gpuq, one job per text (no grouping)     {median(single):7.1f} texts/s   runs: {_fmt(single)}")
    print(f"  ratio grouped / direct                   {median(grouped) / median(direct):7.3f}x   (target >= 0.9x)")


def bench_stats(args: argparse.Namespace) -> None:
    """Needs no Redis: only the SQL history queries are timed."""
    seeded, timings = stats_bench.run(args.postgres_url, args.stats_rows, args.rounds)
    print("\n" + stats_bench.report(seeded, timings, args.rounds))


def bench_db_growth(args: argparse.Namespace) -> None:
    """Space, not speed: bytes per job in both databases and in Redis, and what a prune frees."""
    print("\n" + db_growth.run(args.postgres_url, args.redis_url, args.growth_jobs))


def bench_worker_memory(args: argparse.Namespace) -> None:
    print("\n" + worker_memory.run(args.redis_url, args.slots))


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def bench_upload_line(args: argparse.Namespace) -> None:
    costs = [upload_line.measure(mb) for mb in args.line_mb]
    print("\none upload line fed in 1 MiB chunks: scan time per MB against the line's length")
    for c in costs:
        print(
            f"  {c.megabytes:4d} MB line   scan {c.scan_s:6.2f} s ({c.scan_s_per_mb * 1000:6.1f} ms/MB)"
            f"   json.loads alone {c.parse_s:6.2f} s"
        )
    ratio = costs[-1].scan_s_per_mb / costs[0].scan_s_per_mb
    print(f"  per-MB cost, longest / shortest  {ratio:5.2f}x   (linear: about 1x)")


def bench_soak(args: argparse.Namespace) -> None:
    with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
        result = soak.run_soak(db, redis_url, workdir, args.soak_jobs)
    print(f"\nsoak: {result.jobs} no-op jobs through the API and two workers")
    print(f"  throughput                 {result.jobs_per_s:8.0f} jobs/s over {result.seconds:.0f} s")
    print(f"  single submission          p50 {result.latency_ms(50):.1f} ms, p99 {result.latency_ms(99):.1f} ms")
    print(f"  Redis per queued job       {result.redis_bytes_per_queued_job:8.0f} bytes   (target < 1,024)")
    print(f"  Redis after, jobs all done {result.redis_bytes_after:8d} bytes over the empty db")
    print(f"  API RSS                    {result.api_rss_mib[0]:.0f} -> {result.api_rss_mib[1]:.0f} MiB")
    for i, (start, end) in enumerate(result.worker_rss_mib):
        print(f"  worker {i} RSS               {start:.0f} -> {end:.0f} MiB")
    print(
        f"soak: {result.jobs_per_s:.0f} jobs/s, submit p99 {result.latency_ms(99):.0f} ms, "
        f"{result.redis_bytes_per_queued_job:.0f} bytes/queued job"
    )


def bench_peer(args: argparse.Namespace) -> None:
    """gpuq against llama.cpp's own server, interleaved rounds (bench/peer.py)."""
    binary = peer.llama_server_binary(Path(__file__).resolve().parent.parent)
    runs: dict[tuple[str, str, int], list[peer.Run]] = {}
    for round_ in range(1, args.rounds + 1):
        for k in args.slots:
            for name, prompts in peer.WORKLOADS.items():
                if name not in args.workloads:
                    continue
                sides = [("gpuq", True, True, True), ("llama-server", True, True, True)]
                if args.flash_attn_off:  # both ways side by side: the ratio is not across runs
                    sides.append(("gpuq, flash attn off", True, False, True))
                if name == "W2" and round_ == 1:
                    sides.append(("gpuq, reuse off", False, True, True))  # slow (every prompt whole): once
                if name == "W3" and round_ == 1:
                    sides.append(("gpuq, RAM tier off", True, True, False))  # the slots alone: once
                for side, reuse, flash_attn, prefix_cache in sides:
                    with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
                        if side == "llama-server":
                            run = peer.run_llama_server(binary, prompts, slots=k, threads=args.threads, workdir=workdir)
                        else:
                            run = peer.run_gpuq(
                                db,
                                redis_url,
                                workdir,
                                prompts,
                                slots=k,
                                threads=args.threads,
                                reuse=reuse,
                                flash_attn=flash_attn,
                                prefix_cache=prefix_cache,
                            )
                    runs.setdefault((name, side, k), []).append(run)
                    slot, ram, disk = run.cached
                    cached = (
                        f"; of {run.prompt_tokens} prompt tokens {slot} from a slot, {ram} from RAM, {disk} from disk"
                        if run.prompt_tokens
                        else ""
                    )
                    print(
                        f"round {round_}: K={k} {name} {side}: {run.jobs_per_s:.2f} jobs/s, "
                        f"{run.tokens_per_s:.1f} tok/s ({run.seconds:.1f} s){cached}",
                        flush=True,
                    )
    _print_peer_summary(args, runs)


def _print_peer_summary(args: argparse.Namespace, runs: dict[tuple[str, str, int], list[peer.Run]]) -> None:
    def jobs_s(key: tuple[str, str, int]) -> float:
        return median(r.jobs_per_s for r in runs[key])

    print(
        f"\npeer: 64 jobs a workload, greedy, {peer.MAX_TOKENS} tokens, {args.threads} threads, "
        f"median of {args.rounds} rounds (reuse off, RAM tier off: one round); flash attention on both sides, their "
        f"default (gpuq's also off, as 'gpuq, flash attn off', with --flash-attn-off)"
    )
    print("  K  workload  side                  jobs/s   tok/s")
    for (name, side, k), side_runs in sorted(runs.items(), key=lambda item: (item[0][2], item[0][0], item[0][1])):
        tok = median(r.tokens_per_s for r in side_runs)
        print(f"  {k:<2} {name:<9} {side:<20} {jobs_s((name, side, k)):7.2f} {tok:7.1f}")
    ran = [name for name in peer.WORKLOADS if name in args.workloads]
    for k in args.slots:
        if "W2" in ran:
            gain = jobs_s(("W2", "gpuq", k)) / jobs_s(("W2", "gpuq, reuse off", k))
            print(f"  K={k}: W2 gpuq with reuse / without {gain:.2f}x")
        if "W3" in ran:
            gain = jobs_s(("W3", "gpuq", k)) / jobs_s(("W3", "gpuq, RAM tier off", k))
            print(f"  K={k}: W3 gpuq with the prefix cache's RAM tier / without {gain:.2f}x (target >= 3x)")
        if args.flash_attn_off:
            flash_off = [
                f"{n} {jobs_s((n, 'gpuq, flash attn off', k)) / jobs_s((n, 'llama-server', k)):.2f}x" for n in ran
            ]
            print(f"  K={k}: gpuq's flash attention off, gpuq/llama-server: {', '.join(flash_off)}")
        ratios = [f"{n} gpuq/llama-server {jobs_s((n, 'gpuq', k)) / jobs_s((n, 'llama-server', k)):.2f}x" for n in ran]
        print(f"peer: K={k} {', '.join(ratios)}")


def bench_decoder_steps(args: argparse.Namespace) -> None:
    print(f"\ndecoder steps: K sequences generating {decoder_steps.LENGTH} tokens, {args.threads} threads (ms a step)")
    print("  K   engine's own @50  @2000  ratio   llama_decode @50  @2000   old text handling @50  @2000")
    last = None
    for k in args.slots:
        c = decoder_steps.run(slots=k, threads=args.threads)
        ratio = c.own_ms_at_2000 / c.own_ms_at_50
        print(
            f"  {k:<3} {c.own_ms_at_50:16.2f} {c.own_ms_at_2000:6.2f} {ratio:6.2f}x {c.decode_ms_at_50:17.1f} "
            f"{c.decode_ms_at_2000:6.1f} {c.old_text_ms_at_50:22.2f} {c.old_text_ms_at_2000:6.2f}"
        )
        last = (k, c, ratio)
    if last is not None:
        k, c, ratio = last
        total_50 = c.own_ms_at_50 + c.decode_ms_at_50
        total_2000 = c.own_ms_at_2000 + c.decode_ms_at_2000
        print(
            f"decoder-steps: K={k} engine's own cost @2000/@50 {ratio:.2f}x "
            f"(+{c.own_ms_at_2000 - c.own_ms_at_50:.2f} ms of a {total_2000:.1f} ms step; llama_decode "
            f"{c.decode_ms_at_2000 / c.decode_ms_at_50:.2f}x; whole step {total_2000 / total_50:.2f}x)"
        )


def bench_intake_burst(args: argparse.Namespace) -> None:
    runs = []
    for _ in range(args.rounds):
        with fresh_system_state(args.redis_url, args.database_url) as (_redis_url, db, workdir):
            runs.append(intake_burst.run(db, workdir, threads=args.threads, flash_attn=not args.flash_attn_off))
    attention = ", flash attention off" if args.flash_attn_off else ""
    print(
        f"\nintake burst: 4 long generations, then 32 short jobs taken while they decode"
        f" (K=8{attention}), {args.rounds} rounds"
    )
    print("  round  gap outside (median)  during (median, p99)  llama_decode a step outside/during  ratio p99/median")

    def print_rounds(results: list[intake_burst.BurstResult]) -> None:
        for i, r in enumerate(results, 1):
            print(
                f"  {i:<5}  {r.gap_ms_outside:18.1f} ms  {r.gap_ms_during_median:8.1f} {r.gap_ms_during_p99:8.1f} ms"
                f"  {r.decode_ms_outside:16.1f} / {r.decode_ms_during:5.1f} ms  {r.ratio:12.2f}x"
                f"   ({r.admitted} admitted)"
            )

    print_rounds(runs)
    print(f"intake-burst: inter-token gap p99 during the burst / median outside {median(r.ratio for r in runs):.2f}x")
    alone = [intake_burst.run_engine_alone(threads=args.threads, flash_attn=not args.flash_attn_off) for _ in runs]
    print("\nthe same burst admitted straight into the engine (no claims, SQL or outcomes beside it)")
    print_rounds(alone)
    ratio = median(r.ratio for r in alone)
    print(f"intake-burst: the engine alone, gap p99 during the burst / median outside {ratio:.2f}x")
    if args.peer:
        binary = peer.llama_server_binary(Path(__file__).resolve().parent.parent)
        peers = []
        for _ in range(args.rounds):
            with fresh_system_state(args.redis_url, None) as (_redis_url, _db, workdir):
                peers.append(intake_burst.run_on_llama_server(binary, workdir, threads=args.threads))
        print("\nthe same burst on llama-server -np 8 (gaps between a stream's tokens at the client)")
        for i, p in enumerate(peers, 1):
            print(
                f"  {i:<5}  {p.gap_ms_outside:18.1f} ms  {p.gap_ms_during_median:8.1f} {p.gap_ms_during_p99:8.1f} ms"
                f"  {'':27}  {p.ratio:12.2f}x   ({p.answered} answered)"
            )
        ratio = median(p.ratio for p in peers)
        print(f"intake-burst: llama-server's gap p99 during the burst / median outside {ratio:.2f}x")


def bench_structured(args: argparse.Namespace) -> None:
    """Interleaved rounds (each side once a round), the same jobs on every side.

    Constrained answers end when their JSON does, unconstrained ones run to max_tokens, so
    the plain tokens/s of the two sides compare a prefill every few dozen tokens with one
    every 128. The ratio that counts puts llguidance beside the same prompts unconstrained
    and cut, each, at the length its llguidance answer had ("equal lengths"): the same
    tokens decoded and the same prefills paid, so what differs is the constraint's cost."""
    k, pairs = args.structured_slots, structured.jobs(args.structured_jobs, args.structured_max_tokens)
    model = structured.load(k, args.threads)
    sides = ("unconstrained", "llguidance", "unconstrained, equal lengths", "llama.cpp grammar")
    runs: dict[str, list[structured.Side]] = {name: [] for name in sides}
    try:
        for _ in range(args.rounds):
            for name in sides:
                equal = name == "unconstrained, equal lengths"
                side = structured.run_side(
                    model,
                    pairs,
                    "unconstrained" if equal else name,
                    max_tokens=args.structured_max_tokens,
                    lengths=runs["llguidance"][-1].lengths if equal else None,
                )
                side.name = name
                print(f"  ({name}: {side.tokens_per_s:.1f} tokens/s, valid {side.valid}/{side.finished})", flush=True)
                runs[name].append(side)
    finally:
        model.close()
    print(
        f"\nstructured output: {len(pairs)} chat jobs, {len(structured.SCHEMAS)} schemas, K={k}, "
        f"{args.threads} threads, max_tokens {args.structured_max_tokens}, median of {args.rounds} rounds"
    )
    print("  side                          tokens/s   runs                  compile s  ended  valid  failed")
    for name in sides:
        rs = runs[name]
        last = rs[-1]
        valid = f"{last.valid}/{last.finished}" if not name.startswith("unconstrained") else "-"
        print(
            f"  {name:<28} {median(r.tokens_per_s for r in rs):8.1f}   "
            f"{', '.join(f'{r.tokens_per_s:.1f}' for r in rs):<21} {last.compile_seconds:8.2f}  "
            f"{last.finished:5}  {valid:>7}  {last.failed:5}"
        )
        for example in last.invalid_examples:
            print(f"      invalid: {example}")
    plain = median(r.tokens_per_s for r in runs["unconstrained"])
    same = median(r.tokens_per_s for r in runs["unconstrained, equal lengths"])
    ours = median(r.tokens_per_s for r in runs["llguidance"])
    grammar = median(r.tokens_per_s for r in runs["llama.cpp grammar"])
    lg = runs["llguidance"][-1]
    print(
        f"structured: K={k} llguidance / unconstrained at equal lengths {ours / same:.3f}x (target >= 0.9x), "
        f"/ unconstrained to max_tokens {ours / plain:.3f}x, llama.cpp grammar / unconstrained "
        f"{grammar / plain:.3f}x; valid {lg.valid}/{lg.finished} ended"
    )


def bench_structured_replay(args: argparse.Namespace) -> None:
    """The constraint's own cost a token, no decode around it (what it adds to each step)."""
    pairs = structured.jobs(args.structured_jobs, args.structured_max_tokens)
    model = structured.load(1, args.threads)
    try:
        figures = structured.replay(model, pairs, max_tokens=args.structured_max_tokens)
    finally:
        model.close()
    print(f"\nstructured replay: {len(pairs)} jobs, {len(structured.SCHEMAS)} schemas, random logits, greedy")
    for f in figures:
        print(
            f"  {f.name:<18} {f.ms_per_token:7.3f} ms a token ({f.tokens} tokens)  valid {f.valid}/{f.ended} ended"
            f"  schemas refused {f.refused}"
        )
    ours, grammar = figures
    print(
        f"structured-replay: llguidance {ours.ms_per_token:.3f} ms/token, llama.cpp grammar {grammar.ms_per_token:.3f}"
    )


def bench_scoring(args: argparse.Namespace) -> None:
    """200 multiple-choice items scored by loglikelihood (bench/scoring.py), interleaved rounds."""
    direct_runs, gpuq_runs = [], []
    for round_ in range(1, args.rounds + 1):
        direct_runs.append(scoring.run_direct(threads=args.threads))
        with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
            gpuq_runs.append(scoring.run_gpuq(db, redis_url, workdir, threads=args.threads))
        print(
            f"round {round_}: direct {direct_runs[-1].items_per_s:.2f} items/s, gpuq {gpuq_runs[-1].items_per_s:.2f}",
            flush=True,
        )
    agree = sum(d == g for d, g in zip(direct_runs[0].picks, gpuq_runs[0].picks, strict=True))
    direct, ours = median(r.items_per_s for r in direct_runs), median(r.items_per_s for r in gpuq_runs)
    print(f"\nscoring: {len(scoring.ITEMS)} items x 4 choices, echo + logprobs, median of {args.rounds} rounds")
    print(f"  direct llama-cpp-python loop {direct:.2f} items/s; gpuq {ours:.2f} items/s; picks agree {agree}/200")
    print(f"scoring: gpuq/direct {ours / direct:.2f}x")


def bench_invariance(args: argparse.Namespace) -> None:
    checks = invariance.run(threads=args.threads)
    print("\ninvariance: max |logit difference| of the same row computed in two passes (0: exact)")
    for check in checks:
        print(f"  flash attention {'on ' if check.flash_attn else 'off'}  {check.what:<66} {check.max_abs_diff:.3g}")
    for flash_attn in (False, True):
        own = [c for c in checks if c.flash_attn == flash_attn]
        exact = sum(c.max_abs_diff == 0 for c in own)
        print(f"invariance: flash attention {'on' if flash_attn else 'off'}, {exact} of {len(own)} exact")


def bench_restore(args: argparse.Namespace) -> None:
    figures = restore.run(rounds=args.rounds, threads=args.threads)
    print(restore.report(figures, rounds=args.rounds, threads=args.threads))


def bench_fairness(args: argparse.Namespace) -> None:
    """Tenant A's 96 jobs, then tenant B's 4 a second later (bench/fairness.py): fair shares
    against one FIFO queue, interleaved rounds on fresh state."""
    sides: dict[bool, list[fairness.Side]] = {True: [], False: []}
    for round_ in range(1, args.rounds + 1):
        for fair in (False, True):
            with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
                side = fairness.run(
                    db, redis_url, workdir, fair=fair, max_tokens=args.fairness_max_tokens, slots=args.fairness_slots
                )
            sides[fair].append(side)
            print(
                f"round {round_} {'fair' if fair else 'FIFO'}: B's last finished after {side.a_before_b_done} of A's; "
                f"{side.jobs_per_s:.2f} jobs/s ({side.seconds:.1f} s)",
                flush=True,
            )
    fifo = median(s.jobs_per_s for s in sides[False])
    fair_rate = median(s.jobs_per_s for s in sides[True])
    print(
        f"\nfairness: A {fairness.A_JOBS} jobs, B {fairness.B_JOBS} jobs {fairness.B_DELAY_S:.0f} s later, "
        f"max_tokens {args.fairness_max_tokens}, {args.fairness_slots} slots, one worker, "
        f"median of {args.rounds} rounds"
    )
    for fair, name in ((False, "FIFO (one queue)"), (True, "fair shares")):
        runs = sides[fair]
        print(
            f"  {name:<18} B's last after {median(s.a_before_b_done for s in runs):5.0f} of A's jobs   "
            f"{median(s.jobs_per_s for s in runs):6.2f} jobs/s"
        )
    print(f"  fair / FIFO throughput {fair_rate / fifo:.3f}x   (targets: B's last after <= 16 of A's; >= 0.95x)")


def bench_batch_plan(args: argparse.Namespace) -> None:
    """One batch of prompt families, interleaved, on one worker: queued in file order against
    planned (bench/batch_plan.py), interleaved rounds on fresh state."""
    sides: dict[bool, list[batch_plan.Side]] = {False: [], True: []}
    for round_ in range(1, args.rounds + 1):
        for planned in (False, True):
            with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
                side = batch_plan.run(
                    db,
                    redis_url,
                    workdir,
                    planned=planned,
                    families=args.plan_families,
                    per_family=args.plan_per_family,
                    max_tokens=args.max_tokens,
                    slots=args.plan_slots,
                    threads=args.threads,
                    grouped=args.plan_grouped,
                    ram_bytes=args.plan_ram_bytes,
                )
            sides[planned].append(side)
            print(
                f"round {round_} {'planned' if planned else 'file order'}: {side.cached_share:.2f} of "
                f"{side.prompt_tokens} prompt tokens from a cache ({side.cached_ram_tokens} from RAM), "
                f"{side.jobs_per_s:.3f} jobs/s ({side.seconds:.1f} s), groups {side.groups}",
                flush=True,
            )
    lines = args.plan_families * args.plan_per_family
    print(
        f"\nbatch-plan: {lines} lines ({args.plan_families} families of {args.plan_per_family}, "
        f"{'grouped' if args.plan_grouped else 'interleaved'}), greedy, max_tokens {args.max_tokens}, one worker, "
        f"K={args.plan_slots}, RAM tier {'off' if args.plan_ram_bytes == 0 else 'on'}, {args.threads} threads, "
        f"median of {args.rounds} rounds"
    )
    print("  side         from cache   of prompt tokens   jobs/s    seconds")
    for planned, name in ((False, "file order"), (True, "planned")):
        runs = sides[planned]
        print(
            f"  {name:<12} {median(s.cached_share for s in runs):10.2f}   {runs[0].prompt_tokens:16d}   "
            f"{median(s.jobs_per_s for s in runs):6.3f}   {median(s.seconds for s in runs):7.1f}"
        )
    share = median(s.cached_share for s in sides[True])
    ratio = median(s.jobs_per_s for s in sides[True]) / median(s.jobs_per_s for s in sides[False])
    print(
        f"batch-plan: planned {share:.2f} of prompt tokens from cache (target >= 0.7), "
        f"file order {median(s.cached_share for s in sides[False]):.2f}; jobs/s planned / file order {ratio:.2f}x "
        "(target >= 2x)"
    )


def bench_fleet_prefix(args: argparse.Namespace) -> None:
    """Two workers, W3's prompt families: prefix routing off against on (bench/fleet_prefix.py),
    per workload, sides interleaved, on fresh state."""
    workloads = [w for w in args.fleet_workloads if w in fleet_prefix.WORKLOADS]
    sides: dict[tuple[str, bool], list[fleet_prefix.Side]] = {(w, r): [] for w in workloads for r in (False, True)}
    for round_ in range(1, args.rounds + 1):
        for workload in workloads:
            for routing in (False, True):
                with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
                    side = fleet_prefix.run(
                        db,
                        redis_url,
                        workdir,
                        workload=workload,
                        routing=routing,
                        families=args.plan_families,
                        per_family=args.plan_per_family,
                        max_tokens=args.max_tokens,
                        slots=args.plan_slots,
                        threads=args.threads,
                        ram_bytes=args.plan_ram_bytes,
                    )
                sides[(workload, routing)].append(side)
                print(
                    f"round {round_} {workload} routing {'on' if routing else 'off'}: {side.cached_share:.2f} of "
                    f"{side.prompt_tokens} prompt tokens from a cache, {side.jobs_per_s:.3f} jobs/s "
                    f"({side.seconds:.1f} s), jobs per worker {side.per_worker}",
                    flush=True,
                )
    lines = args.plan_families * args.plan_per_family
    print(
        f"\nfleet-prefix: {lines} jobs ({args.plan_families} families of {args.plan_per_family}, interleaved), greedy, "
        f"max_tokens {args.max_tokens}, 2 CPU workers (GPUQ_SIMULATED_GPUS=24,24), K={args.plan_slots}, "
        f"RAM tier {'off' if args.plan_ram_bytes == 0 else 'on'}, {args.threads} threads each, "
        f"median of {args.rounds} rounds"
    )
    print("  workload   routing   from cache   jobs/s    seconds   jobs per worker")
    for workload in workloads:
        for routing in (False, True):
            runs = sides[(workload, routing)]
            print(
                f"  {workload:<10} {'on' if routing else 'off':<9} {median(s.cached_share for s in runs):10.2f}   "
                f"{median(s.jobs_per_s for s in runs):6.3f}   {median(s.seconds for s in runs):7.1f}   "
                f"{runs[0].per_worker}"
            )
    for workload in workloads:
        on, off = sides[(workload, True)], sides[(workload, False)]
        ratio = median(s.jobs_per_s for s in on) / median(s.jobs_per_s for s in off)
        target = "within 5%: 0.95x..1.05x" if workload == "distinct" else "targets: on >= 0.7 from cache, >= 1.5x"
        print(
            f"fleet-prefix {workload}: from cache off {median(s.cached_share for s in off):.2f}, "
            f"on {median(s.cached_share for s in on):.2f}; jobs/s on / off {ratio:.2f}x ({target})"
        )


def bench_admission(args: argparse.Namespace) -> None:
    """One tenant's queue of --admission-jobs jobs, without deadlines, with one, and with 7
    interleaved (bench/admission.py), interleaved rounds on fresh state."""
    kinds = {0: "plain", 1: "one deadline", 7: "7 deadlines"}
    sides: dict[int, list[admission.Side]] = {k: [] for k in kinds}
    for _ in range(args.rounds):
        for deadlines in kinds:
            with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, _workdir):
                sides[deadlines].append(admission.run(db, redis_url, args.admission_jobs, deadlines=deadlines))
    database = "SQLite" if args.database_url is None else args.database_url.split(":", 1)[0]
    print(f"\nadmission: {args.admission_jobs} queued jobs of one tenant, {database}, median of {args.rounds} rounds")
    print(
        "  side          enqueue jobs/s (Redis us/job)   picks/s (Redis us/pick)   position ms   "
        "work-waiting query ms   count(*) ms"
    )
    for deadlines, name in kinds.items():
        runs = sides[deadlines]
        print(
            f"  {name:<13} {median(s.enqueue_per_s for s in runs):14.0f} ({median(s.enqueue_us for s in runs):6.1f})"
            f"   {median(s.pick_per_s for s in runs):10.0f} ({median(s.pick_us for s in runs):6.1f})"
            f"   {median(s.position_ms for s in runs):11.1f} {median(s.backlog_ms for s in runs):23.1f} "
            f"{median(s.count_ms for s in runs):13.1f}"
        )
    enqueue = {d: median(s.enqueue_us for s in runs) for d, runs in sides.items()}
    picks = {d: median(s.pick_us for s in runs) for d, runs in sides.items()}
    for deadlines in (1, 7):
        print(
            f"  {kinds[deadlines]} / plain, Redis's time: enqueue {enqueue[deadlines] / enqueue[0]:.2f}x, "
            f"pick {picks[deadlines] / picks[0]:.2f}x"
        )


def bench_preempt(args: argparse.Namespace) -> None:
    """K slots decoding long low-priority answers, then a short high-priority job
    (bench/preempt.py): preemption off, park and strict, interleaved rounds on fresh state."""
    sides: dict[str, list[preempt.Side]] = {mode: [] for mode in preempt.MODES}
    k = args.preempt_slots
    for round_ in range(1, args.rounds + 1):
        for mode in preempt.MODES:
            with fresh_system_state(args.redis_url, args.database_url) as (redis_url, db, workdir):
                side = preempt.run(db, redis_url, workdir, mode=mode, slots=k, max_tokens=args.preempt_max_tokens)
            sides[mode].append(side)
            print(
                f"round {round_} {mode:<6}: high job {side.busy_s:.2f} s beside {k} low ({side.idle_s:.2f} s idle); "
                f"low jobs {side.lows_busy_s:.1f} s ({side.lows_alone_s:.1f} s alone), parked {side.parked_ms} ms",
                flush=True,
            )
    print(
        f"\npreempt: {k} slots decoding low jobs of {args.preempt_max_tokens} tokens, one high job of "
        f"{preempt.URGENT_TOKENS} tokens {preempt.DECODING_S:.0f} s into them, one worker, "
        f"median of {args.rounds} rounds"
    )
    ratios = {}
    for mode in preempt.MODES:
        runs = sides[mode]
        latency = median(s.busy_s / s.idle_s for s in runs)
        lows = median(s.lows_busy_s / (s.lows_alone_s + s.urgent_run_s) for s in runs)
        ratios[mode] = (latency, lows)
        print(
            f"  {mode:<6}  high job {median(s.busy_s for s in runs):6.2f} s = {latency:6.2f}x idle "
            f"({median(s.idle_s for s in runs):.2f} s)   low jobs {lows:.3f}x (alone + the high job's run)"
        )
    print(
        f"preempt: K={k} high job {ratios['strict'][0]:.2f}x idle strict, {ratios['park'][0]:.2f}x park, "
        f"{ratios['off'][0]:.2f}x off; low jobs {ratios['strict'][1]:.3f}x strict   (targets: <= 1.5x; <= 1.1x)"
    )


BENCHMARKS: dict[str, Callable[[argparse.Namespace], None]] = {
    "dispatch": bench_dispatch,
    "generation": bench_generation,
    "streaming": bench_streaming,
    "batching": bench_batching,
    "model-swap": bench_model_swap,
    "batch-accept": bench_batch_accept,
    "batch-start": bench_batch_start,
    "message-batch-start": bench_message_batch_start,
    "embeddings": bench_embeddings,
    "stats": bench_stats,
    "db-growth": bench_db_growth,
    "worker-memory": bench_worker_memory,
    "upload-line": bench_upload_line,
    "soak": bench_soak,
    "peer": bench_peer,
    "decoder-steps": bench_decoder_steps,
    "intake-burst": bench_intake_burst,
    "structured": bench_structured,
    "structured-replay": bench_structured_replay,
    "scoring": bench_scoring,
    "invariance": bench_invariance,
    "restore": bench_restore,
    "fairness": bench_fairness,
    "batch-plan": bench_batch_plan,
    "fleet-prefix": bench_fleet_prefix,
    "admission": bench_admission,
    "preempt": bench_preempt,
}


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    args.which = args.which or list(BENCHMARKS)
    if unknown := set(args.which) - set(BENCHMARKS):
        parser.error(f"unknown benchmark {', '.join(sorted(unknown))}; choose from {', '.join(BENCHMARKS)}")
    for name in args.which:
        BENCHMARKS[name](args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("which", nargs="*", help=f"any of {', '.join(BENCHMARKS)} (default: all)")
    parser.add_argument("--jobs", type=int, default=2000, help="no-op jobs for the dispatch benchmark")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads on both sides")
    parser.add_argument("--max-tokens", type=int, default=64)
    _engine_options(parser.add_argument_group("the engine: peer, batching, intake-burst, structured"))
    _size_options(parser.add_argument_group("sizes and stores"))
    _scheduling_options(parser.add_argument_group("scheduling: fairness, batch-plan, fleet-prefix, admission, preempt"))
    return parser


def _engine_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--flash-attn-off",
        action="store_true",
        help="peer: gpuq's workers also with GPUQ_WORKER_FLASH_ATTN=false, side by side; intake-burst: its engine",
    )
    group.add_argument(
        "--peer", action="store_true", help="intake-burst: the same burst on llama-server too, after gpuq's rounds"
    )
    group.add_argument(
        "--slots",
        type=lambda text: [int(k) for k in text.split(",")],
        default=[1, 4, 8, 16],
        help="batching and worker-memory: the K values to run, comma-separated",
    )
    group.add_argument(
        "--workloads",
        type=lambda text: text.split(","),
        default=["W1", "W2", "W3"],
        help="peer: the workloads to run, comma-separated",
    )
    group.add_argument("--structured-jobs", type=int, default=200, help="structured: chat jobs, each with a schema")
    group.add_argument("--structured-slots", type=int, default=8, help="structured: K, the slots of the decoder")
    group.add_argument("--structured-max-tokens", type=int, default=128, help="structured: each job's max_tokens")


def _size_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--batch-lines", type=int, default=50_000, help="lines for the batch-accept benchmark")
    group.add_argument(
        "--start-lines",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[10_000, 50_000],
        help="batch-start: file sizes in lines, comma-separated",
    )
    group.add_argument("--embed-texts", type=int, default=512, help="texts for the embeddings benchmark")
    group.add_argument("--redis-url", default=DEFAULT_REDIS, help="a Redis db the benchmark may flush")
    group.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    group.add_argument(
        "--postgres-url", default=DEFAULT_POSTGRES, help="stats: a PostgreSQL server to create a scratch database on"
    )
    group.add_argument("--stats-rows", type=int, default=1_000_000, help="job rows the stats benchmark seeds")
    group.add_argument(
        "--line-mb",
        type=lambda text: [int(mb) for mb in text.split(",")],
        default=[16, 96],
        help="upload-line: line lengths in MB, comma-separated",
    )
    group.add_argument("--growth-jobs", type=int, default=20_000, help="db-growth: N, jobs per measurement step")
    group.add_argument("--soak-jobs", type=int, default=100_000, help="soak: no-op jobs submitted in bulk")


def _scheduling_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--fairness-max-tokens", type=int, default=8, help="fairness: each job's max_tokens")
    group.add_argument("--fairness-slots", type=int, default=4, help="fairness: K, the worker's slots")
    group.add_argument("--plan-families", type=int, default=8, help="batch-plan: prompt families (at most 8)")
    group.add_argument("--plan-per-family", type=int, default=8, help="batch-plan: lines a family")
    group.add_argument("--plan-slots", type=int, default=4, help="batch-plan: K, the worker's slots")
    group.add_argument(
        "--plan-grouped", action="store_true", help="batch-plan: each family's lines together in the file"
    )
    group.add_argument(
        "--plan-ram-bytes",
        type=int,
        default=-1,
        help="batch-plan and fleet-prefix: each worker's RAM tier (-1: its default; 0: off)",
    )
    group.add_argument(
        "--fleet-workloads",
        type=lambda text: text.split(","),
        default=list(fleet_prefix.WORKLOADS),
        help="fleet-prefix: the workloads to run, comma-separated (stream, batch, distinct); it uses --plan-families, "
        "--plan-per-family and --plan-slots",
    )
    group.add_argument("--admission-jobs", type=int, default=50_000, help="admission: jobs in the queue")
    group.add_argument("--preempt-slots", type=int, default=4, help="preempt: K, the worker's slots")
    group.add_argument("--preempt-max-tokens", type=int, default=256, help="preempt: each low job's max_tokens")


if __name__ == "__main__":
    main()
