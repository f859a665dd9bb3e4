"""`subic serve`: image search over HTTP, a REST API and a web page.

One process holds one model and one `ImageIndex` and answers:

- `POST /search?k=10`: a picture as the request body (`Content-Type:
  image/png`, `image/jpeg`, ...) or as the multipart field `image`. Answers
  `{"results": [{"rank", "score", "id", "path", "exact"}, ...],
  "predicted_class", "class_name", "probability", "k", "milliseconds"}`;
  `exact` marks a stored picture identical to the query, and `class_name`
  is the predicted class's name when the model knows it (trained on a
  folder), else `null`.
- `POST /search/query?k=10`, JSON `{"query": [M·K floats]}`: the same
  `results` for a query vector computed elsewhere (`Subic.query`).
- `POST /search/codes?k=10`, JSON `{"codes": [M ints]}`: stored pictures
  ranked by the number of blocks equal to the code.
- `GET /items/{id}`: the picture's file.
- `GET /health`, `GET /stats`: liveness (and a failed or stuck reload);
  items, M, K, bits, model, query.
- `POST /reload` (or the signal `SIGHUP`): reads the index file again,
  without dropping requests.
- `GET /`: the web page.

Built on FastAPI (Starlette and uvicorn): the well-kept standard for Python
HTTP APIs, with request validation, multipart uploads and an ASGI server in
one install, and nothing to learn for a Keras user who has written a Python
web service before.

Concurrency: requests run in worker threads that share the model (a
`tf.function`, safe to call from several threads) and the index (searches
share its read lock). A reload reads the new index in a worker of its own,
one reload at a time, and swaps a single reference when it is complete, so
a request sees either the old or the new index, whole, and searches never
wait for a reload. Every bad request gets a 4xx answer `{"error": "…"}`;
the server never answers a user's mistake with a 500 or a traceback.

What the server trusts (docs/pictures.md, "Threat model"): the model file
and the folder it serves, both named when it starts. Requests are bounded
(body size, JSON depth and number length, `k`, pixels and decoding memory
shared by concurrent uploads); files are read only inside the folder,
checked on the opened descriptor (`paths.open_in_folder`), so a link
swapped in mid-request serves nothing outside; an index file, at start or
at a reload, must record that very folder.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.resources
import ipaddress
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from concurrent.futures import Future

import numpy as np
from fastapi import FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from subic_keras import images as image_files
from subic_keras import retrieval
from subic_keras._validation import load_json
from subic_keras.paths import open_in_folder
from subic_keras.search.image_index import ImageIndex

LOG = logging.getLogger(__name__)

MAX_K = 1000
# Memory that concurrent uploads may take to decode, together (`DecodeBudget`).
DECODE_BYTES = 128_000_000
# How long `POST /reload` waits for its reload before answering that it is
# still running; `/health` reports a reload running longer as stuck.
RELOAD_SECONDS = 30.0
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_CHUNK = 64 * 1024  # bytes of a picture file sent at a time
# Room for the multipart envelope around an uploaded picture.
_MULTIPART_OVERHEAD = 64 * 1024
_CONTENT_TYPES = {
    ".bmp": "image/bmp",
    ".gif": "image/gif",
    ".jpeg": "image/jpeg",
    ".jpg": "image/jpeg",
    ".png": "image/png",
    ".webp": "image/webp",
}


class ApiError(Exception):
    """A request the server refuses: its HTTP status and what to tell the client."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class ReloadBusyError(RuntimeError):
    """A reload asked for while another one is still running."""


@dataclasses.dataclass(frozen=True)
class _Loaded:
    index: ImageIndex
    loaded_at: float


def served_folder(folder: str | os.PathLike) -> str:
    """The real path of the folder a server may read files from.

    Raises:
        FileNotFoundError, NotADirectoryError: `folder` is no folder.
        ValueError: `folder` is the file system's root.
    """
    real = os.path.realpath(os.fspath(folder))
    if not os.path.exists(real):
        raise FileNotFoundError(2, "the pictures' folder does not exist", real)
    if not os.path.isdir(real):
        raise NotADirectoryError(20, "the pictures' folder is not a folder", real)
    if os.path.dirname(real) == real:
        raise ValueError(
            f"refusing to serve the whole file system ({real!r}) as the folder of "
            "pictures; build the index from the pictures' own folder"
        )
    return real


class SearchService:
    """The model and the index that a server answers with.

    Args:
        model_path: the SuBiC `.keras` model that built the index.
        index_path: an index file built from a folder (`ImageIndex`).
        query: the query kind (`None`: the one saved with the model).
        max_upload_bytes: the largest picture a request may upload.
        scanner: what scans the index's codes (`SubicIndex`'s argument).
        folder: the folder whose files may be served; `None`: the one the
            index records, as it is when the service starts. Every index
            loaded later (a reload) must record the same folder.
        decode_bytes: memory all concurrent uploads may take to decode.
        reload_seconds: how long `POST /reload` waits for its reload.

    Raises:
        ValueError: for a model or index file that cannot be read, an index
            of other codes than the model's, or of another folder.
        OSError: the folder is missing or not a folder.
    """

    def __init__(
        self,
        model_path: str,
        index_path: str,
        query: str | None = None,
        max_upload_bytes: int = 20_000_000,
        scanner: str = "auto",
        folder: str | os.PathLike | None = None,
        decode_bytes: int = DECODE_BYTES,
        reload_seconds: float = RELOAD_SECONDS,
    ):
        import tensorflow as tf

        from subic_keras.export import load_subic

        self.model_path = model_path
        self.index_path = index_path
        self.scanner = scanner
        self.max_upload_bytes = int(max_upload_bytes)
        self.decode_budget = image_files.DecodeBudget(decode_bytes)
        self.reload_seconds = float(reload_seconds)
        self.subic = load_subic(model_path)
        self.query_kind = query or self.subic.default_query
        self.class_names = getattr(self.subic.train_model, "class_names", None)
        self.image_shape = retrieval.input_shape(self.subic)
        model = self.subic.query_model(self.query_kind)
        spec = tf.TensorSpec((None, *self.image_shape), tf.uint8)
        self._encode = tf.function(model, input_signature=[spec])
        index = ImageIndex.load(self.index_path, scanner=self.scanner)
        self.folder = served_folder(index.root if folder is None else folder)
        self._state = self._accept(index)
        # One reload at a time, each in a daemon thread of its own: a reload
        # that hangs (a slow disk) holds no thread that searches need, and
        # does not keep the process from exiting.
        self._reload_guard = threading.Lock()
        self._reload: Future | None = None
        self._reload_started = 0.0
        self._reload_error: str | None = None
        self.encode(np.zeros((1, *self.image_shape), np.uint8))  # trace once now

    # The index ------------------------------------------------------------

    def _accept(self, index: ImageIndex) -> _Loaded:
        """`index` checked against the model and the served folder."""
        retrieval.check_model_fits(index, self.subic, f"index {self.index_path}")
        if os.path.realpath(index.root) != self.folder:
            raise ValueError(
                f"index {self.index_path} records the folder {index.root!r}, but "
                f"this server serves {self.folder!r}; an index of another folder "
                "is refused"
            )
        return _Loaded(index, time.time())

    @property
    def index(self) -> ImageIndex:
        return self._state.index

    def _reload_now(self) -> dict:
        try:
            state = self._accept(ImageIndex.load(self.index_path, scanner=self.scanner))
        except BaseException as error:
            self._reload_error = " ".join(str(error).split())[:500]
            raise
        self._state, self._reload_error = state, None
        return {"status": "reloaded", "items": len(state.index)}

    def start_reload(self) -> Future:
        """Starts reading the index file again, in the reload worker.

        Returns:
            The reload's future: its result `{"status", "items"}`, or the
            `ValueError`/`OSError` that kept the old index.

        Raises:
            ReloadBusyError: a reload is running already.
        """
        with self._reload_guard:
            running = self._reload
            if running is not None and not running.done():
                seconds = time.time() - self._reload_started
                raise ReloadBusyError(
                    f"a reload is running already (for {seconds:.0f} s); the index "
                    "in use answers meanwhile"
                )
            self._reload_started = time.time()
            future: Future = Future()
            future.set_running_or_notify_cancel()
            self._reload = future

        def work() -> None:
            try:
                future.set_result(self._reload_now())
            except BaseException as error:
                future.set_exception(error)

        threading.Thread(target=work, name="subic-reload", daemon=True).start()
        return future

    def reload(self, timeout: float | None = None) -> dict:
        """Reads the index file again; requests keep being answered meanwhile.

        Raises:
            ValueError, OSError: the file cannot be read or is refused (the
                old index stays).
            ReloadBusyError: a reload is running already.
            TimeoutError: the reload did not end within `timeout` seconds
                (it goes on; `health()` tells when it ends).
        """
        return self.start_reload().result(timeout)

    def health(self) -> dict:
        """`{"status", "items", "reload"}`: "degraded" while the last reload
        failed or one has run longer than `reload_seconds`."""
        reload: dict = {"state": "idle"}
        running = self._reload
        if running is not None and not running.done():
            seconds = time.time() - self._reload_started
            stuck = seconds > self.reload_seconds
            reload = {"state": "stuck" if stuck else "running"}
            reload["seconds"] = round(seconds, 1)
        elif self._reload_error is not None:
            reload = {"state": "failed", "error": self._reload_error}
        status = "ok" if reload["state"] in ("idle", "running") else "degraded"
        return {"status": status, "items": len(self.index), "reload": reload}

    # Searching --------------------------------------------------------------

    def encode(self, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Queries `(n, M·K)` and class probabilities of uint8 pictures."""
        queries, probabilities = self._encode(pixels)
        return queries.numpy(), probabilities.numpy()

    def check_k(self, k: int) -> int:
        if not 1 <= k <= MAX_K:
            raise ApiError(422, f"k must be in [1, {MAX_K}], received {k}")
        return k

    def search_image(self, data: bytes, k: int) -> dict:
        """Searches with an encoded picture (PNG, JPEG, GIF, BMP, WebP)."""
        start = time.perf_counter()
        k = self.check_k(k)
        if not data:
            raise ApiError(400, "the request holds no picture (empty body)")
        try:
            pixels = image_files.decode_image(
                data, self.image_shape, budget=self.decode_budget
            )
        except image_files.ImageTooLargeError as error:
            raise ApiError(413, str(error)) from None
        except image_files.ImageDecodeError as error:
            raise ApiError(
                415, f"not a picture this server can read: {error}"
            ) from None
        except TimeoutError as error:
            raise ApiError(503, str(error)) from None
        queries, probabilities = self.encode(pixels[None])
        answer = self._search(
            self._state.index, queries, k, image_files.fingerprint(pixels)
        )
        best = int(np.argmax(probabilities[0]))
        answer.update(
            predicted_class=best,
            class_name=self.class_names[best] if self.class_names else None,
            probability=round(float(probabilities[0, best]), 6),
            milliseconds=round(1000 * (time.perf_counter() - start), 3),
        )
        return answer

    def search_query(self, query, k: int) -> dict:
        """Searches with a query vector `z*` (`M·K` floats)."""
        start = time.perf_counter()
        k = self.check_k(k)
        index = self._state.index
        width = index.num_blocks * index.block_size
        vector = _number_list(query, "query", width, float)
        if not all(math.isfinite(value) for value in vector):
            raise ApiError(422, "query must hold finite numbers")
        # Each score adds M of them in float32: larger values overflow.
        bound = _FLOAT32_MAX / index.num_blocks
        largest = max(abs(value) for value in vector)
        if largest > bound:
            raise ApiError(
                422, f"query values must lie within ±{bound:.4g}, so that a sum of "
                f"{index.num_blocks} of them stays finite in float32; received "
                f"{largest:.4g}",
            )  # fmt: skip
        answer = self._search(index, np.array([vector], np.float32), k, 0)
        answer["milliseconds"] = round(1000 * (time.perf_counter() - start), 3)
        return answer

    def search_codes(self, codes, k: int) -> dict:
        """Ranks stored pictures by the number of blocks equal to `codes`."""
        k = self.check_k(k)
        index = self._state.index
        values = _number_list(codes, "codes", index.num_blocks, int)
        if not all(0 <= value < index.block_size for value in values):
            raise ApiError(
                422, f"codes must be integers in [0, {index.block_size}), "
                f"received {values[:16]}",
            )  # fmt: skip
        scores, ids = index.index.search_codes(np.array([values]), k)
        return {"k": k, "results": _results(index, scores[0], ids[0], set())}

    def _search(self, index: ImageIndex, queries, k: int, fingerprint: int) -> dict:
        scores, ids = index.search(queries, k, fingerprints=[fingerprint])
        exact = set(index.exact_copies(fingerprint).tolist()) if fingerprint else set()
        return {"k": k, "results": _results(index, scores[0], ids[0], exact)}

    def open_item(self, item_id: int) -> tuple[int, str]:
        """`(descriptor, content type)` of a picture's file, opened inside
        the served folder only (`paths.open_in_folder`); the caller closes
        the descriptor."""
        try:
            (relative,) = self._state.index.paths([item_id])
        except KeyError:
            raise ApiError(404, f"no item with id {item_id}") from None
        try:
            fd = open_in_folder(self.folder, relative)
        except PermissionError:
            raise ApiError(403, f"item {item_id} lies outside the folder") from None
        except FileNotFoundError:
            raise ApiError(404, f"the file of item {item_id} is gone") from None
        except OSError as error:
            reason = error.strerror or str(error)
            raise ApiError(404, f"the file of item {item_id}: {reason}") from None
        extension = os.path.splitext(relative)[1].lower()
        return fd, _CONTENT_TYPES.get(extension, "application/octet-stream")

    def stats(self) -> dict:
        state = self._state
        index = state.index
        return {
            "items": len(index),
            "num_blocks": index.num_blocks,
            "block_size": index.block_size,
            "bits": index.num_blocks * (index.block_size.bit_length() - 1),
            "model": os.path.basename(self.model_path),
            "index": os.path.basename(self.index_path),
            "folder": os.path.basename(self.folder),
            "query": self.query_kind,
            "image_shape": list(self.image_shape),
            "num_classes": self.subic.num_classes,
            "class_names": self.class_names,
            "loaded_at": state.loaded_at,
            "max_k": MAX_K,
            "max_upload_bytes": self.max_upload_bytes,
        }


def _number_list(values, name: str, length: int, kind) -> list:
    if not isinstance(values, list) or len(values) != length:
        size = len(values) if isinstance(values, list) else type(values).__name__
        raise ApiError(
            422, f"{name} must be a list of {length} numbers, received {size}"
        )
    if kind is int:
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    else:
        ok = all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
        )
    if not ok:
        raise ApiError(422, f"{name} must hold only {kind.__name__} numbers")
    return [kind(v) for v in values]


def _results(index: ImageIndex, scores, ids, exact: set) -> list[dict]:
    paths = index.paths(ids)
    return [
        {
            "rank": rank,
            "score": round(float(score), 6),
            "id": int(item),
            "path": path,
            "exact": int(item) in exact,
        }
        for rank, (score, item, path) in enumerate(zip(scores, ids, paths), start=1)
    ]


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

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError):
        return JSONResponse({"error": error.message}, status_code=error.status)

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
    async def search(request: Request, k: int = Query(10)):
        service.check_k(k)
        data = await _picture(request, service.max_upload_bytes)
        return JSONResponse(await run_in_threadpool(service.search_image, data, k))

    @app.post("/search/query")
    async def search_query(request: Request, k: int = Query(10)):
        body = await _json(request, "query")
        answer = await run_in_threadpool(service.search_query, body["query"], k)
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


def _file_chunks(fd: int):
    """The bytes of an open file, a chunk at a time; closes it at the end
    (or when the client leaves and the response is dropped)."""
    with open(fd, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            yield chunk


async def _read_limited(request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise ApiError(413, f"the upload is larger than {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the upload is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _picture(request, limit: int) -> bytes:
    """The uploaded picture: the raw body, or the multipart field `image`."""
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        return await _read_limited(request, limit)
    body = await _read_limited(request, limit + _MULTIPART_OVERHEAD)
    boundary = content_type.partition("boundary=")[2].split(";")[0].strip('" ')
    if boundary and f"--{boundary}--".encode() not in body:
        raise ApiError(
            400, "malformed multipart upload: its closing boundary is missing "
            "(a truncated upload?)",
        )  # fmt: skip

    async def stream():
        yield body

    parser = MultiPartParser(
        request.headers, stream(), max_files=1, max_fields=10, max_part_size=limit
    )
    try:
        form = await parser.parse()
    except MultiPartException as error:
        raise ApiError(400, f"malformed multipart upload: {error.message}") from None
    upload = form.get("image")
    if upload is None or isinstance(upload, str):
        raise ApiError(400, "a multipart upload needs the picture in the field 'image'")
    data = await upload.read()
    await form.close()  # the upload's spooled temporary file
    if len(data) > limit:
        raise ApiError(413, f"the upload is larger than {limit} bytes")
    return data


async def _json(request, field: str) -> dict:
    body = await _read_limited(request, 4 * 1024 * 1024)
    try:
        value = load_json(body)
    except ValueError as error:
        raise ApiError(400, f"the body is not JSON: {error}") from None
    if not isinstance(value, dict) or field not in value:
        raise ApiError(422, f'the body must be a JSON object with "{field}"')
    return value


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on `host:port` (`port` 0: a free port).

    Raises:
        OSError: the address cannot be listened on (in use, not this
            machine's, or not an address), naming it.
    """
    try:
        (family, kind, proto, _, address), *_ = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        sock = socket.socket(family, kind, proto)
    except OSError as error:
        raise OSError(f"cannot listen on {host!r}: {error.strerror or error}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as error:
        sock.close()
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise OSError(f"cannot listen on {where}: {error.strerror or error}") from None
    return sock


def url(sock: socket.socket) -> str:
    """The address a listening socket answers at, with the port it bound."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def is_wildcard(host: str) -> bool:
    """Whether `host` means every interface (`0.0.0.0`, `::`)."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


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
    config = uvicorn.Config(create_app(service), log_level="warning")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass  # Ctrl+C after uvicorn's own graceful shutdown: a normal stop
    finally:
        sock.close()
