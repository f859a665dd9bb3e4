"""`subic serve`: image search over HTTP, a REST API and a web page.

One process holds one model and one index of a folder's pictures (an
`ImageIndex` file, a shard manifest of such files searched on Ray,
`RayIndex`, or a Milvus collection of the folder, `MilvusPictures`) and
answers:

- `POST /search?k=10`: a picture as the request body (`Content-Type:
  image/png`, `image/jpeg`, ...) or as the multipart field `image`. Answers
  `{"results": [{"rank", "score", "id", "path", "class", "added",
  "attributes", "exact", "copy"}, ...], "predicted_class",
  "class_name", "probability", "k", "where", "milliseconds"}` (the rows of
  `subic_keras.search.answer_rows` marked by `subic_keras.instance.copies.mark`, as
  the command line gives them); `exact` marks a stored picture identical to
  the query, `copy` one that is (an instance code's rule) or is a copy of
  it; `class_name` is the predicted class's name when the model knows
  it (trained on a folder), else `null`, and an instance code, which has
  no classes, answers `null` for the class and its probability.
  `&where=EXPR` keeps the pictures a filter expression keeps
  (`subic_keras.search.filters`; e.g. `path under "holidays"`), inside the
  scan: the exact `k` best of them.
- `POST /search/query?k=10`, JSON `{"query": [M·K floats]}`: the same
  `results` for a query vector computed elsewhere (`Subic.query`); `where`
  as above.
- `POST /search/codes?k=10`, JSON `{"codes": [M ints]}`: stored pictures
  ranked by the number of blocks equal to the code.
- `GET /items/{id}`: the picture's file.
- `GET /health`, `GET /stats`: liveness (and a failed or stuck reload);
  items, M, K, bits, model, query.
- `POST /reload` (or the signal `SIGHUP`): reads the index file again,
  without dropping requests (a Milvus collection, changed in place, is
  opened again).
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

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from subic_keras.data import images as image_files
from subic_keras.data.paths import open_in_folder
from subic_keras.instance import copies
from subic_keras.instance.instance_code import InstanceSubic
from subic_keras.search import filters
from subic_keras.search.addresses import is_database
from subic_keras.search.base import PictureIndex, answer_rows
from subic_keras.search.image_index import ImageIndex
from subic_keras.search.manifests import is_manifest
from subic_keras.search.ray_index import RayIndex, ShardUnavailableError
from subic_keras.search.uri import DEFAULT_COLLECTION
from subic_keras.serving import retrieval

LOG = logging.getLogger(__name__)

MAX_K = 1000
# Folders the page offers as filters (the first, in order).
MAX_FOLDERS = 1000
# Memory that concurrent uploads may take to decode, together (`DecodeBudget`).
DECODE_BYTES = 128_000_000
# How long `POST /reload` waits for its reload before answering that it is
# still running; `/health` reports a reload running longer as stuck.
RELOAD_SECONDS = 30.0
_FLOAT32_MAX = float(np.finfo(np.float32).max)
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
    index: PictureIndex
    loaded_at: float
    # The instance code of the instance codes kept beside a class code's,
    # and its query of uint8 pictures as one TensorFlow graph (requests call
    # it from many threads, as the class model's).
    instance: InstanceSubic | None = None
    instance_query: Callable | None = None


def open_pictures(
    path: str, scanner: str = "auto", collection: str = DEFAULT_COLLECTION
) -> PictureIndex:
    """The picture index at `path`: a file built from a folder
    (`ImageIndex`), a shard manifest of such files (`RayIndex`), or a
    Milvus collection of a folder (`MilvusPictures`).

    Raises:
        ValueError: for a file, manifest or collection of codes without
            image paths.
    """
    if is_database(path):
        from subic_keras.search.milvus_pictures import MilvusPictures

        # Refuses (and closes) a collection of codes without paths.
        return MilvusPictures(path, collection)
    if not is_manifest(path):
        return ImageIndex.load(path, scanner=scanner)
    index = RayIndex(path, scanner=scanner)
    if not index.holds_pictures:
        raise ValueError(
            f"{path!r} lists shards of codes without image paths; build picture "
            "shards from a folder with `subic index build MODEL DIR --output "
            "X.shards.json`"
        )
    return index


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
        index_path: an index file built from a folder (`ImageIndex`), or a
            shard manifest of such files (`RayIndex`, on the Ray cluster
            of `RAY_ADDRESS`, or one started here).
        query: the query kind (`None`: the one saved with the model).
        max_upload_bytes: the largest picture a request may upload.
        scanner: what scans the index's codes (`SubicIndex`'s argument).
        folder: the folder whose files may be served; `None`: the one the
            index records, as it is when the service starts. Every index
            loaded later (a reload) must record the same folder.
        decode_bytes: memory all concurrent uploads may take to decode.
        reload_seconds: how long `POST /reload` waits for its reload.
        collection: the collection, where `index_path` is a Milvus one.

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
        collection: str = DEFAULT_COLLECTION,
    ):
        import tensorflow as tf

        from subic_keras.serving.export import load_encoder

        self.model_path = model_path
        self.index_path = index_path
        self.scanner, self.collection = scanner, collection
        self.max_upload_bytes = int(max_upload_bytes)
        self.decode_budget = image_files.DecodeBudget(decode_bytes)
        self.reload_seconds = float(reload_seconds)
        self.subic = load_encoder(model_path)
        self.query_kind = query or self.subic.default_query
        self.class_names = getattr(self.subic.train_model, "class_names", None)
        self.image_shape = retrieval.input_shape(self.subic)
        model = self.subic.query_model(self.query_kind)
        spec = tf.TensorSpec((None, *self.image_shape), tf.uint8)
        # Without AutoGraph: a Keras model needs no conversion, and AutoGraph's
        # generated files outlive a server that is killed.
        self._encode = tf.function(model, input_signature=[spec], autograph=False)
        index = open_pictures(self.index_path, self.scanner, collection)
        assert index.root is not None  # open_pictures opens pictures only
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

    def _accept(self, index: PictureIndex) -> _Loaded:
        """`index` checked against the model and the served folder."""
        if isinstance(self.subic, InstanceSubic) and index.instance_model is not None:
            index = index.by_instance()  # served by its instance codes alone
        retrieval.check_model_fits(
            index, self.subic, f"index {self.index_path}", self.model_path
        )
        if os.path.realpath(index.root or "") != self.folder:
            raise ValueError(
                f"index {self.index_path} records the folder {index.root!r}, but "
                f"this server serves {self.folder!r}; an index of another folder "
                "is refused"
            )
        if isinstance(self.subic, InstanceSubic):
            return _Loaded(index, time.time())
        state = getattr(self, "_state", None)  # None: the first index
        digest = (index.instance_model or {}).get("digest")
        if (
            state is not None
            and state.instance is not None
            and digest == (state.index.instance_model or {}).get("digest")
        ):  # the same instance code: kept loaded
            return _Loaded(index, time.time(), state.instance, state.instance_query)
        instance = retrieval.instance_encoder(index)
        if instance is None:
            return _Loaded(index, time.time())
        import tensorflow as tf

        shape = retrieval.input_shape(instance)
        spec = tf.TensorSpec((None, *shape), tf.uint8)
        query = tf.function(
            instance.query_model(), input_signature=[spec], autograph=False
        )
        query(np.zeros((1, *shape), np.uint8))  # traced now, not by a request
        return _Loaded(index, time.time(), instance, query)

    @property
    def index(self) -> PictureIndex:
        return self._state.index

    def _reload_now(self) -> dict:
        try:
            state = self._accept(
                open_pictures(self.index_path, self.scanner, self.collection)
            )
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
        failed or one has run longer than `reload_seconds`, or while a shard
        of a manifest cannot answer (`"shards"`: each one's reason; `items`
        None when they cannot be counted)."""
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
        index = self.index
        items: int | None = None
        try:
            items = len(index)
        except ShardUnavailableError:
            pass  # named under "shards" below
        answer = {"status": status, "items": items, "reload": reload}
        unavailable = index.unavailable
        if unavailable:
            answer.update(status="degraded", shards=unavailable)
        return answer

    # Searching --------------------------------------------------------------

    def encode(self, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Queries `(n, M·K)` and class probabilities of uint8 pictures (`None`
        for an instance code, which has no classes)."""
        outputs = self._encode(pixels)
        if not isinstance(outputs, (list, tuple)):  # one output: the queries
            return outputs.numpy(), None
        queries, probabilities = outputs
        return queries.numpy(), probabilities.numpy()

    def check_k(self, k: int) -> int:
        if not 1 <= k <= MAX_K:
            raise ApiError(422, f"k must be in [1, {MAX_K}], received {k}")
        return k

    def check_where(self, where: str | filters.Filter | None):
        """A filter expression parsed (422 naming the problem), or None; a
        filter parsed already is taken as it is."""
        if where is None or isinstance(where, filters.Filter):
            return where
        if not isinstance(where, str):
            raise ApiError(
                422, f"where must be a filter expression (text), received "
                f"{type(where).__name__}",
            )  # fmt: skip
        if not where.strip():
            return None
        try:
            return filters.parse(where)
        except ValueError as error:
            raise ApiError(422, str(error)) from None

    def search_image(
        self, data: bytes, k: int, where: str | filters.Filter | None = None
    ) -> dict:
        """Searches with an encoded picture (PNG, JPEG, GIF, BMP, WebP)."""
        start = time.perf_counter()
        k = self.check_k(k)
        condition = self.check_where(where)
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
        state = self._state
        index = state.index
        more = {}
        if state.instance is not None:  # instance codes beside the class codes
            own = state.instance.own_pictures(pixels[None])
            assert state.instance_query is not None  # made with the instance code
            outputs = state.instance_query(own)
            if isinstance(outputs, (list, tuple)):  # the one output, in a list
                (outputs,) = outputs
            more["instance_queries"] = outputs.numpy()
        answer = self._search(
            index, queries, k, condition, image_files.fingerprint(pixels), **more
        )
        best = probability = name = None  # an instance code has no classes
        if probabilities is not None:
            best = int(np.argmax(probabilities[0]))
            probability = round(float(probabilities[0, best]), 6)
            name = self.class_names[best] if self.class_names else None
        answer.update(
            predicted_class=best,
            class_name=name,
            probability=probability,
            milliseconds=round(1000 * (time.perf_counter() - start), 3),
        )
        return answer

    def search_query(self, query, k: int, where: str | None = None) -> dict:
        """Searches with a query vector `z*` (`M·K` floats)."""
        start = time.perf_counter()
        k = self.check_k(k)
        condition = self.check_where(where)
        index = self._state.index
        width = index.num_blocks * index.block_size
        vector = np.array(_number_list(query, "query", width, float))
        if not np.isfinite(vector).all():
            raise ApiError(422, "query must hold finite numbers")
        # Each score adds M of them in float32: larger values overflow.
        bound = _FLOAT32_MAX / index.num_blocks
        largest = float(np.abs(vector).max())
        if largest > bound:
            raise ApiError(
                422, f"query values must lie within ±{bound:.4g}, so that a sum of "
                f"{index.num_blocks} of them stays finite in float32; received "
                f"{largest:.4g}",
            )  # fmt: skip
        answer = self._search(index, vector[None].astype(np.float32), k, condition, 0)
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
        scores, ids = index.search_codes(np.array([values]), k)
        return {"k": k, "results": answer_rows(index, scores, ids)[0]}

    def _search(
        self,
        index: PictureIndex,
        queries,
        k: int,
        where,
        fingerprint: int,
        **more,
    ):
        try:
            rows = index.answer(
                queries, k, where=where, fingerprints=[fingerprint], **more
            )
        except ValueError as error:  # a filter on a field this index lacks
            raise ApiError(422, str(error)) from None
        margin = copies.copy_margin_for(index, self.subic)  # the folder's rule
        copies.mark(rows, queries, index.block_size, margin, bool(more))
        return {
            "k": k,
            "where": None if where is None else str(where),
            "results": rows[0],
        }

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

    def _index_name(self) -> str:
        name = os.path.basename(self.index_path.rstrip("/"))
        if is_database(self.index_path):
            return f"{name}, collection {self.collection}"
        return name

    def stats(self) -> dict:
        state = self._state
        index = state.index
        return {
            "items": len(index),
            "num_blocks": index.num_blocks,
            "block_size": index.block_size,
            "bits": index.num_blocks * (index.block_size.bit_length() - 1),
            "model": _shown(os.path.basename(self.model_path)),
            "index": _shown(self._index_name()),
            "folder": _shown(os.path.basename(self.folder)),
            "query": self.query_kind,
            "image_shape": list(self.image_shape),
            "num_classes": self.subic.num_classes,
            "class_names": self.class_names,
            "loaded_at": state.loaded_at,
            "max_k": MAX_K,
            "max_upload_bytes": self.max_upload_bytes,
            "folders": index.folders()[:MAX_FOLDERS],
            # Copies first, by an instance code kept beside the class code.
            "instance_codes": state.instance is not None,
        }


def _shown(name: str) -> str:
    """A file name as JSON can carry it: the bytes of a name that is not
    UTF-8 (kept by Python as surrogates) shown as U+FFFD."""
    return os.fsencode(name).decode("utf-8", "replace")


def _number_list(values, name: str, length: int, kind) -> list:
    if not isinstance(values, list) or len(values) != length:
        size = len(values) if isinstance(values, list) else type(values).__name__
        raise ApiError(
            422, f"{name} must be a list of {length} numbers, received {size}"
        )
    # JSON gives exactly these types (a bool's is its own: refused).
    if not set(map(type, values)) <= ({int} if kind is int else {int, float}):
        raise ApiError(422, f"{name} must hold only {kind.__name__} numbers")
    return [kind(v) for v in values]
