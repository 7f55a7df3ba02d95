"""The scheduler's duties fail, back off and recover on their own; webhooks are sent off its tick."""

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise

import pytest

from gpuq.db.tables import Batch, DeliveryStatus, WebhookDelivery
from gpuq.scheduler import MAX_BACKOFF_S, Duty, Scheduler
from gpuq.settings import Settings
from tests.gpuq.batches.test_finalize import finish_lines, start
from tests.gpuq.batches.test_webhooks import finish_job


class Receiver:
    """A webhook receiver on loopback that takes ``delay_s`` to answer each POST."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.events: list[dict] = []
        self.in_flight = self.most_in_flight = 0
        lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                with lock:
                    receiver.in_flight += 1
                    receiver.most_in_flight = max(receiver.most_in_flight, receiver.in_flight)
                time.sleep(delay_s)
                receiver.events.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                with lock:
                    receiver.in_flight -= 1
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                """Keep the test output quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def make_receiver() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(delay_s: float = 0.0) -> Receiver:
        made.append(Receiver(delay_s))
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


@pytest.fixture
def running(database_url, tmp_path) -> Iterator[Callable[..., Scheduler]]:
    """Starts a scheduler (short ticks) in a thread, stopped and closed after the test."""
    started: list[tuple[Scheduler, threading.Event, threading.Thread]] = []

    def run(scheduler: Scheduler) -> Scheduler:
        stop = threading.Event()
        thread = threading.Thread(target=scheduler.run, args=(stop,), daemon=True)
        thread.start()
        started.append((scheduler, stop, thread))
        return scheduler

    yield run
    for scheduler, stop, thread in started:
        stop.set()
        thread.join(timeout=10)
        scheduler.close()


def settings_for(database_url: str, redis_url: str, data_dir, **overrides) -> Settings:
    return Settings(database_url=database_url, redis_url=redis_url, data_dir=data_dir, **overrides)


def wait_for(condition: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def failure_logs(caplog, name: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "gpuq.scheduler" and r.getMessage().startswith(f"scheduler: {name} failed")
    ]


def test_a_failing_duty_backs_off_exponentially_and_is_logged_once_per_streak(caplog):
    broken = True

    def flaky() -> None:
        if broken:
            raise RuntimeError("the database is down")

    duty = Duty("flaky", flaky, interval_s=1.0)
    delays = []
    with caplog.at_level(logging.INFO, logger="gpuq.scheduler"):
        for _ in range(8):
            before_s = time.monotonic()
            duty.run()
            after_s = time.monotonic()
            delays.append(duty.delay_s)
            assert before_s + duty.delay_s <= duty.next_run_at <= after_s + duty.delay_s  # due a delay after it ran
        assert delays == [2, 4, 8, 16, 32, MAX_BACKOFF_S, MAX_BACKOFF_S, MAX_BACKOFF_S]
        [first] = failure_logs(caplog, "flaky")  # eight failures, one log line, with the traceback
        assert first.levelno == logging.ERROR and "the database is down" in str(first.exc_info[1])

        broken = False
        duty.run()
        assert (duty.failures, duty.delay_s) == (0, 1.0)  # back to its pace
        [recovered] = [r for r in caplog.records if "recovered" in r.getMessage()]
        assert "scheduler: flaky recovered; it failed 8 times since " in recovered.getMessage()

        broken = True
        duty.run()  # a new streak is logged again
        assert len(failure_logs(caplog, "flaky")) == 2 and duty.delay_s == 2


def test_a_duty_failing_every_tick_does_not_stop_the_others(
    database_url, redis, tmp_path, session, make_receiver, running, caplog
):
    # Redis is down for this scheduler (nothing listens on port 1): aging and the reconciler
    # fail on every run. Batches and webhooks only need SQL, so they must go on.
    receiver = make_receiver()
    batch = start(session, redis, tmp_path / "inputs", webhook_url=receiver.url)
    finish_lines(session, batch.id)
    settings = settings_for(
        database_url, "redis://127.0.0.1:1/0", tmp_path, reconcile_interval_s=0.1, webhook_allowed_hosts="127.0.0.1"
    )
    with caplog.at_level(logging.INFO, logger="gpuq.scheduler"):
        scheduler = running(Scheduler(settings, tick_s=0.05))
        wait_for(lambda: [e["event"] for e in receiver.events] == ["batch.completed"])
        wait_for(lambda: duties(scheduler)["aging"].failures >= 3)

    session.expire_all()
    assert session.get(Batch, batch.id).status == "completed"
    assert receiver.events[0]["data"]["batch_id"] == batch.id
    aging = duties(scheduler)["aging"]
    assert len(failure_logs(caplog, "aging")) == 1  # logged once, however many ticks it failed
    assert aging.delay_s >= 0.05 * 2**3  # and it backs off
    assert duties(scheduler)["batches"].failures == duties(scheduler)["webhooks"].failures == 0


def duties(scheduler: Scheduler) -> dict[str, Duty]:
    return {duty.name: duty for duty in scheduler.duties}


def test_a_slow_webhook_receiver_does_not_delay_the_other_duties(
    database_url, redis_url, tmp_path, session, make_receiver, running
):
    receiver = make_receiver(delay_s=2.0)
    for _ in range(4):
        finish_job(session, receiver.url)
    settings = settings_for(
        database_url, redis_url, tmp_path, webhook_delivery_threads=2, webhook_allowed_hosts="127.0.0.1"
    )
    scheduler = Scheduler(settings, tick_s=0.05)
    ticks: list[float] = []
    scheduler.duties.append(Duty("probe", lambda: ticks.append(time.monotonic()), interval_s=0.05))
    running(scheduler)

    def delivered() -> int:
        session.expire_all()
        return session.query(WebhookDelivery).filter(WebhookDelivery.status == DeliveryStatus.DELIVERED).count()

    wait_for(lambda: delivered() == 4)  # two at a time, two seconds each: about four seconds
    assert len(receiver.events) == 4 and receiver.most_in_flight == 2
    gaps = [later - earlier for earlier, later in pairwise(ticks)]
    assert len(ticks) > 20 and max(gaps) < 1.0  # a receiver answering in 2 s never held up a tick
