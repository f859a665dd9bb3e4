"""The HTTP face of `subic serve`: the FastAPI application answering for a
`server.SearchService` (the routes of `subic_keras.serving.server`'s docstring),
request bodies read within their bounds, and the socket it listens on.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import signal
import socket
import sys
from concurrent.futures import Future

from fastapi import FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from subic_keras._validation import load_json
from subic_keras.search import filters
from subic_keras.search.ray_index import ShardUnavailableError
from subic_keras.serving.server import (
    LOG,
    ApiError,
    ReloadBusyError,
    SearchService,
)
from subic_keras.serving.sockets import is_wildcard, listen, url

_CHUNK = 64 * 1024  # bytes of a picture file sent at a time
# Room for the multipart envelope around an uploaded picture.
_MULTIPART_OVERHEAD = 64 * 1024
# The longest query string answered; a longer one is a JSON 414 that says
# to send the filter in the body (up to `filters.MAX_LENGTH` characters).
MAX_QUERY_BYTES = 64 * 1024
# What uvicorn's HTTP parser holds of a request line and headers: past
# `MAX_QUERY_BYTES`, so that such a request reaches the app and its 414.
_MAX_HEAD_BYTES = 1 << 20


def _page() -> str:
    return (
        importlib.resources.files("subic_keras")
        .joinpath("static/index.html")
        .read_text(encoding="utf-8")
    )


def create_app(service: SearchService) -> FastAPI:
    """The FastAPI application answering for `service` (module docstring)."""
    app = FastAPI(
        title="SuBiC image search",
        description="Search a folder of pictures with a SuBiC model.",
        version="1",
    )
    page = _page()
    app.add_middleware(_BoundedQuery)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError):
        return JSONResponse({"error": error.message}, status_code=error.status)

    @app.exception_handler(ShardUnavailableError)
    async def _shard(request: Request, error: ShardUnavailableError):
        # A shard of a manifest that could not restart: the index is
        # degraded (GET /health) until it is opened again (POST /reload).
        return JSONResponse({"error": str(error)}, status_code=503)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or e['loc'][0]}: {e['msg']}"
            for e in error.errors()
        )
        return JSONResponse({"error": problems}, status_code=422)

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, error: ClientDisconnect):
        # Nobody is left to answer: one line in the log, no traceback.
        LOG.warning("a client left during its request to %s", request.url.path)
        return Response(status_code=400)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception):
        # A bug of ours, not the client's: logged with its traceback, and
        # answered in JSON like every other error.
        LOG.exception("unexpected error answering %s", request.url.path)
        message = f"internal error ({type(error).__name__})"
        return JSONResponse({"error": message}, status_code=500)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, error: HTTPException):
        return JSONResponse({"error": str(error.detail)}, status_code=error.status_code)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def home():
        return HTMLResponse(page)

    @app.get("/health")
    async def health():
        return service.health()

    @app.get("/stats")
    async def stats():
        return service.stats()

    @app.post("/search")
    async def search(
        request: Request, k: int = Query(10), where: str | None = Query(None)
    ):
        service.check_k(k)
        condition = service.check_where(where)  # refused before the upload is read
        data, field = await _picture(request, service.max_upload_bytes)
        if field is not None:  # a long filter: a field of the multipart body
            condition = service.check_where(_once(where, field))
        answer = await run_in_threadpool(service.search_image, data, k, condition)
        return JSONResponse(answer)

    @app.post("/search/query")
    async def search_query(
        request: Request, k: int = Query(10), where: str | None = Query(None)
    ):
        body = await _json(request, "query")
        if "where" in body:  # a long filter: in the JSON body
            where = _once(where, body["where"])
        answer = await run_in_threadpool(service.search_query, body["query"], k, where)
        return JSONResponse(answer)

    @app.post("/search/codes")
    async def search_codes(request: Request, k: int = Query(10)):
        body = await _json(request, "codes")
        answer = await run_in_threadpool(service.search_codes, body["codes"], k)
        return JSONResponse(answer)

    @app.get("/items/{item_id}")
    async def item(item_id: int):
        if not 0 <= item_id < 2**63:  # ids are int64, never negative
            raise ApiError(404, f"no item with id {item_id}")
        fd, content_type = await run_in_threadpool(service.open_item, item_id)
        return StreamingResponse(_file_chunks(fd), media_type=content_type)

    @app.post("/reload")
    async def reload():
        try:
            future = service.start_reload()
        except ReloadBusyError as error:
            raise ApiError(409, str(error)) from None
        try:
            return await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(future)), service.reload_seconds
            )
        except asyncio.TimeoutError:
            raise ApiError(
                503, f"the reload is still running after {service.reload_seconds:g} "
                "s; the index in use answers meanwhile (GET /health tells when "
                "it ends)",
            ) from None  # fmt: skip
        except (ValueError, OSError, MemoryError) as error:
            reason = " ".join(str(error).split()) or type(error).__name__
            raise ApiError(
                409, f"reload failed, the old index stays: {reason}"
            ) from None

    return app


class _BoundedQuery:
    """Answers a query string longer than `MAX_QUERY_BYTES` with a JSON 414
    before any route parses it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and len(scope["query_string"]) > MAX_QUERY_BYTES:
            response = JSONResponse(
                {
                    "error": f"the query string is longer than {MAX_QUERY_BYTES:,} "
                    "bytes: send a long filter in the body (the multipart field "
                    '"where" with a picture, the JSON field "where" with a query)'
                },
                status_code=414,
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def server_config(app, **options):
    """uvicorn's configuration for `app` (`options` as `uvicorn.Config`'s),
    its HTTP parser holding heads past `MAX_QUERY_BYTES`."""
    import uvicorn

    return uvicorn.Config(
        app,
        h11_max_incomplete_event_size=_MAX_HEAD_BYTES,
        log_level="warning",
        **options,
    )


def _file_chunks(fd: int):
    """The bytes of an open file, a chunk at a time; closes it at the end
    (or when the client leaves and the response is dropped)."""
    with open(fd, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            yield chunk


def _too_large(limit: int) -> ApiError:
    """The refusal of an upload past `limit` bytes: the picture's limit, as
    `/stats` gives it (`max_upload_bytes`), whatever a body may add to it."""
    return ApiError(413, f"the upload is larger than {limit:,} bytes")


async def _read_limited(request, limit: int, said: int | None = None) -> bytes:
    """The body, refused past `limit` bytes, naming `said` (default: `limit`):
    a multipart body may take its fields' room beyond the picture's limit."""
    said = limit if said is None else said
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise _too_large(said)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(said)
        chunks.append(chunk)
    return b"".join(chunks)


def _once(in_query: str | None, in_body):
    """The filter given in the body, refused if the query string has one."""
    if in_query is not None:
        raise ApiError(
            422, "where: give the filter once, in the query string or the body"
        )
    return in_body


async def _picture(request, limit: int) -> tuple[bytes, str | None]:
    """The uploaded picture (the raw body, or the multipart field `image`)
    and the multipart field `where`, if any: a filter too long for a query
    string (up to `filters.MAX_LENGTH` characters)."""
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        return await _read_limited(request, limit), None
    body = await _read_limited(
        request, limit + _MULTIPART_OVERHEAD + 4 * filters.MAX_LENGTH, limit
    )
    boundary = content_type.partition("boundary=")[2].split(";")[0].strip('" ')
    if boundary and f"--{boundary}--".encode() not in body:
        raise ApiError(
            400, "malformed multipart upload: its closing boundary is missing "
            "(a truncated upload?)",
        )  # fmt: skip

    async def stream():
        yield body

    parser = MultiPartParser(
        request.headers,
        stream(),
        max_files=1,
        max_fields=10,
        max_part_size=max(limit, 4 * filters.MAX_LENGTH),
    )
    try:
        form = await parser.parse()
    except MultiPartException as error:
        raise ApiError(400, f"malformed multipart upload: {error.message}") from None
    upload, where = form.get("image"), form.get("where")
    if upload is None or isinstance(upload, str):
        raise ApiError(400, "a multipart upload needs the picture in the field 'image'")
    if where is not None and not isinstance(where, str):
        raise ApiError(422, "where: the field 'where' holds text, not a file")
    data = await upload.read()
    await form.close()  # the upload's spooled temporary file
    if len(data) > limit:
        raise _too_large(limit)
    return data, where


async def _json(request, field: str) -> dict:
    # Room for a query and a filter of `filters.MAX_LENGTH` characters.
    body = await _read_limited(request, 4 * 1024 * 1024 + 6 * filters.MAX_LENGTH)
    try:
        value = load_json(body)
    except ValueError as error:
        raise ApiError(400, f"the body is not JSON: {error}") from None
    if not isinstance(value, dict) or field not in value:
        raise ApiError(422, f'the body must be a JSON object with "{field}"')
    return value


def run(
    service: SearchService,
    host: str = "127.0.0.1",
    port: int = 8000,
    sock: socket.socket | None = None,
) -> None:
    """Serves `service` until interrupted; `SIGHUP` reloads the index.

    Args:
        service: what to answer with.
        host, port: where to listen (`listen`), unless `sock` is given.
        sock: a socket already listening (`listen`): the command line binds
            it before the model loads, so a busy port is said at once.

    Raises:
        OSError: `host:port` cannot be listened on (before anything is
            served or printed).
    """
    import uvicorn

    if sock is None:
        sock = listen(host, port)
    host = sock.getsockname()[0]

    def reload_on_signal(signum, frame):
        def done(future: Future) -> None:
            error = future.exception()
            if error is None:
                print(f"reloaded {service.index_path}: {len(service.index)} items")
            else:
                print(f"reload failed, the old index stays: {error}")

        try:
            service.start_reload().add_done_callback(done)
        except ReloadBusyError as error:
            print(f"reload not started: {error}")

    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, reload_on_signal)
    if is_wildcard(host):
        print(
            f"warning: listening on every network interface ({host}): anyone who "
            "can reach this machine can search the index and read its pictures",
            file=sys.stderr,
            flush=True,
        )
    stats = service.stats()
    print(
        f"serving {stats['items']} pictures of {service.folder} "
        f"({stats['bits']}-bit codes) at {url(sock)}  (Ctrl+C stops)",
        flush=True,
    )
    config = server_config(create_app(service))
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass  # Ctrl+C after uvicorn's own graceful shutdown: a normal stop
    finally:
        sock.close()
