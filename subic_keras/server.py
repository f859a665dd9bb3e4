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
- `GET /health`, `GET /stats`: liveness; items, M, K, bits, model, query.
- `POST /reload` (or the signal `SIGHUP`): reads the index file again,
  without dropping requests.
- `GET /`: the web page.

Built on FastAPI (Starlette and uvicorn): the well-kept standard for Python
HTTP APIs, with request validation, multipart uploads and an ASGI server in
one install, and nothing to learn for a Keras user who has written a Python
web service before.

Concurrency: requests run in worker threads that share the model (a
`tf.function`, safe to call from several threads) and the index (searches
share its read lock). A reload builds the new index beside the old one and
swaps a single reference, so a request sees either the old or the new
index, whole. Every bad request gets a 4xx answer `{"error": "…"}`; the
server never answers a user's mistake with a 500 or a traceback, and it only
ever reads files inside the indexed folder.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import logging
import math
import os
import signal
import threading
import time

import numpy as np
from fastapi import FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser

from subic_keras import images as image_files
from subic_keras import retrieval
from subic_keras.search.image_index import ImageIndex

LOG = logging.getLogger(__name__)

MAX_K = 1000
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


@dataclasses.dataclass(frozen=True)
class _Loaded:
    index: ImageIndex
    loaded_at: float


class SearchService:
    """The model and the index that a server answers with.

    Args:
        model_path: the SuBiC `.keras` model that built the index.
        index_path: an index file built from a folder (`ImageIndex`).
        query: the query kind (`None`: the one saved with the model).
        max_upload_bytes: the largest picture a request may upload.
        scanner: what scans the index's codes (`SubicIndex`'s argument).

    Raises:
        ValueError: for a model or index file that cannot be read, or an
            index of other codes than the model's.
    """

    def __init__(
        self,
        model_path: str,
        index_path: str,
        query: str | None = None,
        max_upload_bytes: int = 20_000_000,
        scanner: str = "auto",
    ):
        import tensorflow as tf

        from subic_keras.export import load_subic

        self.model_path = model_path
        self.index_path = index_path
        self.scanner = scanner
        self.max_upload_bytes = int(max_upload_bytes)
        self.subic = load_subic(model_path)
        self.query_kind = query or self.subic.default_query
        self.class_names = getattr(self.subic.train_model, "class_names", None)
        self.image_shape = retrieval.input_shape(self.subic)
        model = self.subic.query_model(self.query_kind)
        spec = tf.TensorSpec((None, *self.image_shape), tf.uint8)
        self._encode = tf.function(model, input_signature=[spec])
        self._reload_lock = threading.Lock()
        self._state = self._load()
        self.encode(np.zeros((1, *self.image_shape), np.uint8))  # trace once now

    # The index ------------------------------------------------------------

    def _load(self) -> _Loaded:
        index = ImageIndex.load(self.index_path, scanner=self.scanner)
        retrieval.check_model_fits(index, self.subic, f"index {self.index_path}")
        return _Loaded(index, time.time())

    @property
    def index(self) -> ImageIndex:
        return self._state.index

    def reload(self) -> dict:
        """Reads the index file again; requests keep being answered meanwhile.

        Raises:
            ValueError, OSError: the file cannot be read (the old index stays).
        """
        with self._reload_lock:
            self._state = self._load()
        return {"status": "reloaded", "items": len(self._state.index)}

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
            pixels = image_files.decode_image(data, self.image_shape)
        except image_files.ImageDecodeError as error:
            raise ApiError(
                415, f"not a picture this server can read: {error}"
            ) from None
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

    def item_file(self, item_id: int) -> tuple[str, str]:
        """`(real path, content type)` of a picture, inside the folder only."""
        index = self._state.index
        try:
            path = index.file(item_id)
        except KeyError:
            raise ApiError(404, f"no item with id {item_id}") from None
        except PermissionError:
            raise ApiError(403, f"item {item_id} lies outside the folder") from None
        except FileNotFoundError:
            raise ApiError(404, f"the file of item {item_id} is gone") from None
        extension = os.path.splitext(path)[1].lower()
        return path, _CONTENT_TYPES.get(extension, "application/octet-stream")

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
            "folder": os.path.basename(index.root.rstrip("/")) or index.root,
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
        return {"status": "ok", "items": len(service.index)}

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
        path, content_type = service.item_file(item_id)
        return FileResponse(path, media_type=content_type)

    @app.post("/reload")
    async def reload():
        try:
            return await run_in_threadpool(service.reload)
        except (ValueError, OSError) as error:
            raise ApiError(
                409, f"reload failed, the old index stays: {error}"
            ) from None

    return app


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
        value = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ApiError(400, f"the body is not JSON: {error}") from None
    if not isinstance(value, dict) or field not in value:
        raise ApiError(422, f'the body must be a JSON object with "{field}"')
    return value


def run(service: SearchService, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serves `service` until interrupted; `SIGHUP` reloads the index."""
    import uvicorn

    def reload_on_signal(signum, frame):
        def reload():
            try:
                service.reload()
                print(f"reloaded {service.index_path}: {len(service.index)} items")
            except (ValueError, OSError) as error:
                print(f"reload failed, the old index stays: {error}")

        threading.Thread(target=reload, daemon=True).start()

    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, reload_on_signal)
    stats = service.stats()
    print(
        f"serving {stats['items']} pictures of {service.index.root} "
        f"({stats['bits']}-bit codes) at http://{host}:{port}/  (Ctrl+C stops)",
        flush=True,
    )
    uvicorn.run(create_app(service), host=host, port=port, log_level="warning")
