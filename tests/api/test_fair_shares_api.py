"""What admins see and set of fair shares through the API: keys' weights (in SQL and where
the workers' pick reads them in Redis), and each tenant's share of the fleet."""

from __future__ import annotations

from datetime import timedelta

from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import utcnow
from gpuq.redis_keys import FAIR_WEIGHTS_KEY
from tests.conftest import both_databases
from tests.gpuq.stats.test_stats import job

MODEL = "smollm2-135m"


def weights(redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in redis.hgetall(FAIR_WEIGHTS_KEY).items()}


@both_databases
def test_a_keys_weight_is_set_at_creation_changed_later_and_its_tenant_weighs_as_its_heaviest_key(client, redis):
    heavy = client.post("/v1/keys", json={"name": "batch", "owner": "research", "weight": 3})
    light = client.post("/v1/keys", json={"name": "chat", "owner": "research"})
    other = client.post("/v1/keys", json={"name": "app", "owner": "product"})
    assert (heavy.status_code, heavy.json()["weight"], light.json()["weight"]) == (201, 3, 1)
    assert weights(redis) == {"research": 3}  # product weighs the default, 1

    changed = client.patch(f"/v1/keys/{other.json()['id']}", json={"weight": 5})
    assert changed.status_code == 200 and changed.json()["weight"] == 5
    assert weights(redis) == {"research": 3, "product": 5}
    listed = {k["name"]: k["weight"] for k in client.get("/v1/keys").json()["data"]}
    assert (listed["batch"], listed["chat"], listed["app"]) == (3, 1, 5)

    assert client.delete(f"/v1/keys/{heavy.json()['id']}").status_code == 204
    assert weights(redis) == {"product": 5}  # research weighs as its remaining key: 1


def test_a_bad_weight_or_an_unknown_key_is_refused_and_changes_nothing(client, redis):
    made = client.post("/v1/keys", json={"name": "app", "owner": "product", "weight": 2}).json()
    for bad in (0, 1001, 2.5, None):
        refused = client.patch(f"/v1/keys/{made['id']}", json={"weight": bad})
        assert refused.status_code == 422 and "weight" in refused.text
    assert client.post("/v1/keys", json={"name": "x", "owner": "y", "weight": -1}).status_code == 422
    assert client.patch(f"/v1/keys/{made['id']}", json={"weight": 2, "role": "admin"}).status_code == 422
    missing = client.patch("/v1/keys/key_nope", json={"weight": 2})
    assert missing.status_code == 404 and "key_nope" in missing.json()["detail"]
    assert weights(redis) == {"product": 2}


def test_a_submitter_cannot_change_a_weight(client, make_key):
    key = make_key("submitter", "acme")
    made = client.post("/v1/keys", json={"name": "app", "owner": "acme"}).json()
    refused = client.patch(f"/v1/keys/{made['id']}", json={"weight": 9}, headers={"Authorization": f"Bearer {key}"})
    assert refused.status_code == 403


@both_databases
def test_each_tenants_share_now_and_over_the_window(client, database_url):
    now = utcnow()
    rows = [
        job(1, now - timedelta(minutes=5), owner="acme", run_ms=3000),
        job(2, now - timedelta(minutes=4), owner="acme", run_ms=3000),
        job(3, now - timedelta(minutes=3), owner="initech", run_ms=2000),
        job(4, now - timedelta(hours=2), owner="initech", run_ms=50_000),  # before the window
        job(5, None, owner="initech", status="running"),
        job(6, None, owner="initech", status="running"),
        job(7, None, owner="acme", status="running"),
        job(8, None, owner="umbrella", status="queued"),
    ]
    engine = sync_engine(database_url)
    with sync_sessions(engine)() as s:
        s.add_all(rows)
        s.commit()
    engine.dispose()

    shares = {t["tenant"]: t for t in client.get("/v1/stats/tenants").json()["data"]}

    assert set(shares) == {"acme", "initech", "umbrella"}
    acme, initech = shares["acme"], shares["initech"]
    assert (acme["running"], acme["share_now"], initech["running"], initech["share_now"]) == (1, 0.3333, 2, 0.6667)
    assert (acme["finished"], acme["run_s"], acme["share_window"]) == (2, 6.0, 0.75)
    assert (initech["finished"], initech["run_s"], initech["share_window"]) == (1, 2.0, 0.25)
    assert shares["umbrella"] == {
        "tenant": "umbrella", "queued": 1, "running": 0, "share_now": 0.0, "finished": 0, "run_s": 0.0,
        "share_window": 0.0,
    }  # fmt: skip
    assert client.get("/v1/stats/tenants", params={"since": "yesterday"}).status_code == 422
