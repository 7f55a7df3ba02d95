"""/v1/files: OpenAI-compatible batch files (upload, list, metadata, content, delete)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Literal

from fastapi import APIRouter, Form, Query, UploadFile
from fastapi.responses import FileResponse
from sqlalchemy.orm import Session

from api.deps import CallerDep, SessionDep, StateDep, visible_file
from api.errors import errors
from api.schemas import FileObject
from api.schemas.batches import FilesPublic
from api.schemas.openai import FileDeleted
from gpuq import store
from gpuq.batches.files import delete_stored_file, files_dir, save_upload, store_upload
from gpuq.db.tables import File
from gpuq.errors import RequestError

router = APIRouter(prefix="/v1/files", tags=["files"])

CHUNK_BYTES = 1 << 20


@router.post("", response_model=FileObject, responses=errors(507))
async def upload_file(
    file: UploadFile, purpose: Annotated[str, Form()], db: SessionDep, state: StateDep, caller: CallerDep
) -> FileObject:
    """Upload a JSONL batch file (multipart, `purpose=batch`). Checked line by line as it is
    stored; a file with bad lines is refused with their numbers and nothing is kept."""

    async def chunks() -> AsyncIterator[bytes]:
        while chunk := await file.read(CHUNK_BYTES):
            yield chunk

    stored = await store_upload(
        chunks(),
        filename=file.filename or "upload.jsonl",
        purpose=purpose,
        directory=files_dir(state.settings.data_dir),
    )
    stored.owner = caller.owner
    return FileObject.of(await db.run_sync(lambda s: save_upload(s, stored)))


@router.get("", response_model=FilesPublic)
async def list_files(
    db: SessionDep,
    caller: CallerDep,
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> FilesPublic:
    """The caller's tenant's files (an admin's: all), newest first unless `order=asc`; page
    with `after` = the last id, as the openai client does."""

    def read(session: Session) -> tuple[list[File], bool]:
        return store.list_files(
            session, limit=limit, after=after, owner=caller.tenant_filter, purpose=purpose, newest_first=order == "desc"
        )

    try:
        files, has_more = await db.run_sync(read)
    except LookupError:
        raise RequestError(422, f"`after` names file {after!r}, which does not exist", param="after") from None
    return FilesPublic.of(files, has_more)


@router.delete("/{file_id}", response_model=FileDeleted, responses=errors(404, 409))
async def delete_file(file_id: str, db: SessionDep, caller: CallerDep) -> FileDeleted:
    """The file and its bytes. Batches that read it keep their jobs; a schedule that reads it
    must be deleted or given another file first (409)."""
    found = await visible_file(db, caller, file_id)
    await db.run_sync(lambda s: delete_stored_file(s, found))
    return FileDeleted(id=file_id)


@router.get("/{file_id}", response_model=FileObject, responses=errors(404))
async def read_file(file_id: str, db: SessionDep, caller: CallerDep) -> FileObject:
    return FileObject.of(await visible_file(db, caller, file_id))


@router.get(
    "/{file_id}/content",
    response_class=FileResponse,
    responses=errors(404, other={200: {"content": {"application/jsonl": {}}, "description": "The file, as stored"}}),
)
async def file_content(file_id: str, db: SessionDep, caller: CallerDep) -> FileResponse:
    found = await visible_file(db, caller, file_id)
    return FileResponse(found.path, media_type="application/jsonl", filename=found.filename)
