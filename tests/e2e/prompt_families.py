"""What the e2e tests of shared starts (the prefix cache, placement by start, batch planning)
have in common: prompt families with distinct starts, and tenants to run them under (a start
is kept per tenant)."""

from __future__ import annotations

import httpx

from gpuq.cli.client import GpuqClient

MODEL = "smollm2-135m"


def family_start(family: int) -> str:
    """A distinct few-shot start of about 120 tokens (7 blocks of 16)."""
    return "".join(f"Q: what is {a} times {family + 3}? A: {a * (family + 3)}.\n" for a in range(2, 11))


def family_prompt(family: int, question: int = 12) -> str:
    return family_start(family) + f"Q: what is {question} times {family + 3}? A:"


def family_job(family: int, question: int = 12, *, max_tokens: int = 4, **fields: object) -> dict:
    """A greedy job of the family."""
    prompt = family_prompt(family, question)
    return {"kind": "generate", "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0} | fields


def tenant_key(url: str, admin: str, owner: str, **fields: object) -> tuple[str, str]:
    """A new API key of tenant ``owner``, made through the API: (its id, its secret)."""
    made = httpx.post(
        f"{url}/v1/keys",
        json={"name": f"key-{owner}", "owner": owner, **fields},
        headers={"Authorization": f"Bearer {admin}"},
        timeout=30,
    )
    assert made.status_code == 201, made.text
    return str(made.json()["id"]), str(made.json()["key"])


def run_to_success(client: GpuqClient, job: dict) -> dict:
    """The job submitted and waited for; it must succeed."""
    done = client.wait(client.submit(job)["id"])
    assert done["status"] == "succeeded", done
    return done
