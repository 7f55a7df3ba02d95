"""Who is calling: API keys, the tenant (owner) behind each, and what its role lets it see.

A key is ``gpuq_`` followed by 256 random bits. Only its SHA-256 is stored; the secret is
shown once, when the key is created. Admins see and change everything; submitters submit
work and see only their own tenant's jobs, batches, files and webhook deliveries. Another
tenant's object answers 404, exactly like one that does not exist, so ids leak nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuq.db.tables import ApiKey, Role
from gpuq.errors import RequestError


@dataclass(frozen=True, slots=True)
class Caller:
    """The holder of a valid key, as routes and the core see it."""

    key_id: str
    owner: str
    role: Role
    max_queued_jobs: int | None = None
    max_submissions_per_minute: int | None = None
    default_priority: int | None = None  # a Priority value, for requests that name none

    @classmethod
    def of(cls, key: ApiKey) -> Caller:
        return cls(
            key.id, key.owner, Role(key.role), key.max_queued_jobs, key.max_submissions_per_minute, key.default_priority
        )

    def priority_or(self, default: int) -> int:
        """The priority for a request that names none: the key's default, else ``default``."""
        return self.default_priority if self.default_priority is not None else default

    @property
    def is_admin(self) -> bool:
        return self.role == Role.ADMIN

    @property
    def tenant_filter(self) -> str | None:
        """The owner a listing is narrowed to: None for admins (all tenants)."""
        return None if self.is_admin else self.owner

    def may_see(self, owner: str | None) -> bool:
        """Callers are told another tenant's object does not exist (404), so ids leak nothing."""
        return self.is_admin or owner == self.owner

    def require_admin(self) -> None:
        if not self.is_admin:
            raise RequestError(403, f"this needs an admin key; key {self.key_id} has the role {self.role.value!r}")
