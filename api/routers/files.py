"""/v1/files: OpenAI-compatible batch files (upload, metadata, content)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Form, UploadFile
from fastapi.responses import FileResponse

from api.deps import CallerDep, SessionDep, StateDep, visible_file
from api.errors import errors
from api.schemas import FileObject
from gpuq.batches.files import files_dir, save_upload, store_upload

router = APIRouter(prefix="/v1/files", tags=["files"])

CHUNK_BYTES = 1 << 20


@router.post("", response_model=FileObject)
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
