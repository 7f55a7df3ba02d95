"""API keys: creating, finding by secret, listing and revoking them."""

from __future__ import annotations

import enum
import hashlib
import secrets
from datetime import timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from gpuq.db.tables import ApiKey, Role, utcnow
from gpuq.store._sql import commit_changed, rows_changed

KEY_PREFIX = "gpuq_"


def new_secret() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    """A key's stored form: with 256 random bits a slow hash buys nothing, and one indexed
    lookup authenticates a request."""
    return hashlib.sha256(secret.encode()).hexdigest()


# last_used_at is for humans auditing keys: writing it once a minute is precise enough
# and spares a write on every request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def create_api_key(
    session: Session,
    *,
    name: str,
    owner: str,
    role: Role,
    max_queued_jobs: int | None = None,
    max_submissions_per_minute: int | None = None,
    default_priority: int | None = None,
    weight: int = 1,
) -> tuple[ApiKey, str]:
    """Store a new key and return it with its secret, which is not kept anywhere."""
    secret = new_secret()
    key = ApiKey(
        id=f"key_{secrets.token_hex(8)}",
        name=name,
        owner=owner,
        role=role.value,
        key_hash=hash_secret(secret),
        key_prefix=secret[:12],
        max_queued_jobs=max_queued_jobs,
        max_submissions_per_minute=max_submissions_per_minute,
        default_priority=default_priority,
        weight=weight,
        created_at=utcnow(),
    )
    session.add(key)
    session.commit()
    return key, secret


def find_active_key(session: Session, secret: str) -> ApiKey | None:
    """The unrevoked key with this secret, its last use noted; None for anything else."""
    key = session.scalars(
        select(ApiKey).where(ApiKey.key_hash == hash_secret(secret), ApiKey.revoked_at.is_(None))
    ).one_or_none()
    if key is None:
        return None
    now = utcnow()
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        key.last_used_at = now
        session.commit()
    return key


def list_api_keys(session: Session, *, include_revoked: bool = False) -> list[ApiKey]:
    stmt = select(ApiKey).order_by(ApiKey.created_at)
    if not include_revoked:
        stmt = stmt.where(ApiKey.revoked_at.is_(None))
    return list(session.scalars(stmt))


def active_key_named(session: Session, *, owner: str, name: str) -> ApiKey | None:
    """The owner's unrevoked key of that name, if any: names tell a tenant's keys apart."""
    stmt = select(ApiKey).where(ApiKey.owner == owner, ApiKey.name == name, ApiKey.revoked_at.is_(None))
    return session.scalars(stmt.limit(1)).first()


def get_api_key(session: Session, key_id: str) -> ApiKey | None:
    return session.get(ApiKey, key_id)


def revoke_api_key(session: Session, key_id: str) -> bool:
    """True if the key existed and was active; it stops working at once."""
    statement = update(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None)).values(revoked_at=utcnow())
    return commit_changed(session, statement)


class Revocation(enum.StrEnum):
    REVOKED = "revoked"
    NOT_FOUND = "not_found"  # no such key, or revoked already
    LAST_ADMIN = "last_admin"


def revoke_key_keeping_an_admin(session: Session, key_id: str) -> Revocation:
    """Revoke a key unless it is the last active admin key: what the API allows.

    The count and the revocation are one transaction that first holds every active admin
    key, so two admins revoking each other at the same moment cannot both see two admins
    and leave none: a write that changes nothing locks those rows on PostgreSQL (the second
    transaction waits, then counts afresh) and takes SQLite's single write lock.
    """
    session.execute(
        update(ApiKey)
        .where(ApiKey.role == Role.ADMIN.value, ApiKey.revoked_at.is_(None))
        .values(role=ApiKey.role)
        .execution_options(synchronize_session=False)
    )
    key = session.scalars(
        select(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None)).execution_options(populate_existing=True)
    ).one_or_none()
    if key is None:
        session.rollback()
        return Revocation.NOT_FOUND
    if key.role == Role.ADMIN.value:
        admins = session.scalar(
            select(func.count()).select_from(ApiKey).where(ApiKey.role == Role.ADMIN.value, ApiKey.revoked_at.is_(None))
        )
        if (admins or 0) <= 1:
            session.rollback()
            return Revocation.LAST_ADMIN
    key.revoked_at = utcnow()
    session.commit()
    return Revocation.REVOKED


def has_admin_key(session: Session) -> bool:
    return (
        session.scalars(
            select(ApiKey.id).where(ApiKey.role == Role.ADMIN.value, ApiKey.revoked_at.is_(None)).limit(1)
        ).first()
        is not None
    )


def known_owners(session: Session) -> set[str]:
    return set(session.scalars(select(ApiKey.owner).distinct()))


def hold_key_until_commit(session: Session, key_id: str) -> bool:
    """Serialise this key's submissions, and its revocation, from here to the transaction's
    end; False (and nothing held) when the key is revoked by now.

    So a count of its queued jobs stays true until the new ones are committed, and a
    revocation that cancels the key's jobs finds every job a submission of that key ever
    commits: a submission holding the key commits first (and the cancel sees its jobs), or
    it comes after the revocation and is refused here.

    A write that changes nothing does it on both databases: on PostgreSQL it locks the
    key's row (other keys are not held up); on SQLite it takes the database's single write
    lock, which the coming insert needs anyway.
    """
    statement = (
        update(ApiKey)
        .where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
        .values(max_queued_jobs=ApiKey.max_queued_jobs)
    )
    return rows_changed(session, statement) == 1


def set_key_weight(session: Session, key_id: str, weight: int) -> ApiKey | None:
    """The active key with its weight changed; None when there is no such active key."""
    statement = update(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None)).values(weight=weight)
    if not commit_changed(session, statement):
        return None
    return session.scalars(select(ApiKey).where(ApiKey.id == key_id).execution_options(populate_existing=True)).one()


def tenant_weights(session: Session) -> dict[str, int]:
    """Each tenant's weight: that of its heaviest active key."""
    rows = session.execute(
        select(ApiKey.owner, func.max(ApiKey.weight)).where(ApiKey.revoked_at.is_(None)).group_by(ApiKey.owner)
    )
    return {owner: int(weight) for owner, weight in rows}
