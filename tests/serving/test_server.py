"""Tests for subic_keras.serving.server: the REST API of `subic serve`, over
real HTTP."""

import http.client
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import numpy as np
import pytest
from served import (
    ServeProcess,
    ThreadServer,
    multipart,
    picture_folder,
    request,
    request_json,
    ruled_instance,
    save_model,
)
from swapping import link_swapped

from subic_keras.data.images import write_image_folder
from subic_keras.search.image_index import ImageIndex
from subic_keras.serving import retrieval
from subic_keras.serving.export import load_subic
from subic_keras.serving.server import MAX_K, SearchService

# Integration tests (processes, servers, exports): `-m "not slow"` skips them.
pytestmark = pytest.mark.slow

UPLOAD_LIMIT = 50_000


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """A folder of 60 PNGs, a model, and the folder's index file."""
    base = tmp_path_factory.mktemp("serving")
    root = base / "photos"
    paths = picture_folder(root)
    model = save_model(base / "model.keras")
    index, report = retrieval.index_folder(load_subic(model), root)
    assert report.added == 60 and not report.skipped
    index.save(base / "photos.subic")
    return {
        "root": root,
        "paths": paths,
        "model": model,
        "index": base / "photos.subic",
    }


@pytest.fixture(scope="module")
def served(photos):
    service = SearchService(
        photos["model"], str(photos["index"]), max_upload_bytes=UPLOAD_LIMIT
    )
    with ThreadServer(service) as port:
        yield port, service


def _picture(photos, path: str) -> bytes:
    return (photos["root"] / path).read_bytes()


def test_search_with_a_picture_of_the_folder_finds_it_first(photos, served):
    port, service = served
    for path in photos["paths"][:5]:
        data = _picture(photos, path)
        status, answer = request_json(
            port, "POST", "/search?k=7", data, {"Content-Type": "image/png"}
        )
        assert status == 200
        results = answer["results"]
        assert len(results) == 7 and [r["rank"] for r in results] == list(range(1, 8))
        assert results[0]["path"] == path and results[0]["exact"]
        assert not any(r["exact"] for r in results[1:])
        assert 0 <= answer["predicted_class"] < 3 and 0 < answer["probability"] <= 1
        # The rest by decreasing score; every path is the one of its id.
        scores = [r["score"] for r in results[1:]]
        assert scores == sorted(scores, reverse=True)
        ids = [r["id"] for r in results]
        assert service.index.paths(ids) == [r["path"] for r in results]


def test_a_filter_keeps_the_exact_best_of_its_pictures(photos, served):
    port, _service = served
    data = _picture(photos, photos["paths"][4])
    headers = {"Content-Type": "image/png"}
    _, everything = request_json(port, "POST", "/search?k=1000", data, headers)
    folder = photos["paths"][4].split("/")[0]
    where = urllib.parse.quote(f'path under "{folder}"')
    status, answer = request_json(
        port, "POST", f"/search?k=5&where={where}", data, headers
    )
    within = [r for r in everything["results"] if r["path"].startswith(folder + "/")]
    assert status == 200 and answer["where"] == f'path under "{folder}"'
    assert [r["path"] for r in answer["results"]] == [r["path"] for r in within[:5]]
    assert answer["results"][0]["exact"] and answer["results"][0]["class"] == folder
    # The same through a query vector; bad filters are 422 naming the problem.
    vector = json.dumps({"query": [1.0] * 64})
    status, answer = request_json(
        port, "POST", "/search/query?k=3&where=class%20%3D%3D%20%27zz%27", vector
    )
    assert (status, answer["results"]) == (200, [])
    for bad, message in [
        ("colour == 1", "unknown field"),
        ("id ==", "expected a value"),
    ]:
        status, answer = request_json(
            port, "POST", f"/search?where={urllib.parse.quote(bad)}", data, headers
        )
        assert status == 422 and message in answer["error"], answer


def test_stats_of_files_whose_names_are_not_utf8(photos, tmp_path):
    # A model, an index and a folder named with bytes that are not UTF-8:
    # /stats shows them with U+FFFD, never a 500.
    base = os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9")
    os.mkdir(base)
    model = os.path.join(base, os.fsdecode(b"m\xe9.keras"))
    index = os.path.join(base, os.fsdecode(b"i\xe9.subic"))
    folder = os.path.join(base, os.fsdecode(b"ph\xf6tos"))
    shutil.copyfile(photos["model"], model)
    shutil.copytree(photos["root"], folder)
    retrieval.index_folder(load_subic(model), folder, model_path=model)[0].save(index)
    service = SearchService(model, index, folder=folder)
    with ThreadServer(service) as port:
        status, stats = request_json(port, "GET", "/stats")
    assert status == 200, stats
    names = (stats["model"], stats["index"], stats["folder"])
    assert names == ("m\ufffd.keras", "i\ufffd.subic", "ph\ufffdtos")


def test_long_filters_go_in_the_body_and_long_query_strings_are_json_414(
    photos, served
):
    port, _service = served
    data = _picture(photos, photos["paths"][4])
    headers = {"Content-Type": "image/png"}
    folder = photos["paths"][4].split("/")[0]
    short = f'path under "{folder}"'
    _, within = request_json(
        port, "POST", f"/search?k=5&where={urllib.parse.quote(short)}", data, headers
    )
    # 10,000 tests `or`ed: the same answer from a multipart field or JSON.
    chain = " or ".join(["id == -1"] * 9_999 + [short])
    body, form = multipart("image", data, where=chain)
    status, answer = request_json(port, "POST", "/search?k=5", body, form)
    assert status == 200, answer
    assert [r["id"] for r in answer["results"]] == [r["id"] for r in within["results"]]
    vector = [1.0] * 64
    _, expected = request_json(
        port,
        "POST",
        f"/search/query?k=4&where={urllib.parse.quote(short)}",
        json.dumps({"query": vector}),
    )
    status, answer = request_json(
        port, "POST", "/search/query?k=4", json.dumps({"query": vector, "where": chain})
    )
    assert status == 200 and answer["results"] == expected["results"]
    # Given twice, or not as text: 422; too long for a query string: 414.
    for path, payload in (
        (
            "/search/query?where=id%3D%3D1",
            json.dumps({"query": vector, "where": "id == 1"}),
        ),
        ("/search/query", json.dumps({"query": vector, "where": 3})),
    ):
        status, answer = request_json(port, "POST", path, payload)
        assert status == 422 and answer["error"].startswith("where"), answer
    status, answer = request_json(
        port, "POST", f"/search?where={urllib.parse.quote(chain)}", data, headers
    )
    assert status == 414 and "send a long filter in the body" in answer["error"]


def test_multipart_upload_gives_the_same_answer(photos, served):
    port, _ = served
    data = _picture(photos, photos["paths"][7])
    _, raw = request_json(
        port, "POST", "/search?k=5", data, {"Content-Type": "image/png"}
    )
    body, headers = multipart("image", data)
    status, form = request_json(port, "POST", "/search?k=5", body, headers)
    assert status == 200 and form["results"] == raw["results"]


def test_query_vectors_and_codes_are_searched_like_the_index(photos, served):
    port, service = served
    rng = np.random.default_rng(3)
    query = rng.random(64).astype(np.float32)
    status, answer = request_json(
        port, "POST", "/search/query?k=10", json.dumps({"query": query.tolist()})
    )
    scores, ids = service.index.search(query[None], 10)
    assert status == 200
    assert [r["id"] for r in answer["results"]] == ids[0].tolist()
    np.testing.assert_allclose([r["score"] for r in answer["results"]], scores[0], 1e-5)
    code = service.index.get_codes([5])[0].tolist()
    status, answer = request_json(
        port, "POST", "/search/codes?k=3", json.dumps({"codes": code})
    )
    assert status == 200 and answer["results"][0]["score"] == 4


def test_items_are_the_indexed_files(photos, served):
    port, service = served
    for item in service.index.get_ids()[:3]:
        status, content_type, data = request(port, "GET", f"/items/{item}")
        (path,) = service.index.paths([item])
        assert status == 200 and content_type == "image/png"
        assert data == _picture(photos, path)


def test_a_folder_in_milvus_is_served_as_its_index_file(photos, served, tmp_path):
    """The folder's pictures in a Milvus collection answer as the file of
    them does, serve their files, and are named by collection."""
    pytest.importorskip("pymilvus", reason="the [milvus] extra")
    from subic_keras.search.milvus_pictures import MilvusPictures

    port, service = served
    file = service.index
    uri = str(tmp_path / "photos.db")
    collection = MilvusPictures(
        uri, "photos", file.num_blocks, file.block_size, root=file.root,
        image_shape=file.image_shape, model=file.model,
    )  # fmt: skip
    collection.add(file.get_codes(), file.get_paths(), file._items.fingerprints)
    collection.close()
    remote = SearchService(photos["model"], uri, collection="photos")
    headers = {"Content-Type": "image/png"}
    with ThreadServer(remote) as milvus_port:
        for path in photos["paths"][:3]:
            data = _picture(photos, path)
            _, want = request_json(port, "POST", "/search?k=8", data, headers)
            status, got = request_json(
                milvus_port, "POST", "/search?k=8", data, headers
            )
            assert status == 200 and got["results"][0]["path"] == path
            assert [(r["path"], r["exact"]) for r in got["results"]] == [
                (r["path"], r["exact"]) for r in want["results"]
            ]
            item = got["results"][1]["id"]
            status, _, body = request(milvus_port, "GET", f"/items/{item}")
            assert (status, body) == (200, _picture(photos, got["results"][1]["path"]))
        _, stats = request_json(milvus_port, "GET", "/stats")
        assert stats["index"] == "photos.db, collection photos" and stats["items"] == 60
        status, answer = request_json(milvus_port, "POST", "/reload")
        assert (status, answer["items"]) == (200, 60)
    from subic_keras.search.milvus import MilvusIndex

    MilvusIndex(uri, "codes", 4, 16).close()
    with pytest.raises(ValueError, match="collection 'codes' .* without image paths"):
        SearchService(photos["model"], uri, collection="codes")


def test_health_stats_and_page(served):
    port, _ = served
    assert request_json(port, "GET", "/health") == (
        200,
        {"status": "ok", "items": 60, "reload": {"state": "idle"}},
    )
    status, stats = request_json(port, "GET", "/stats")
    assert status == 200
    assert {k: stats[k] for k in ("items", "num_blocks", "block_size", "bits")} == {
        "items": 60,
        "num_blocks": 4,
        "block_size": 16,
        "bits": 16,
    }
    assert stats["model"] == "model.keras" and stats["image_shape"] == [32, 32, 3]
    status, content_type, page = request(port, "GET", "/")
    assert status == 200 and content_type.startswith("text/html")
    assert b"SuBiC image search" in page and b"http" not in page.split(b"<script>")[0]


def _bad_requests(photos):
    data = _picture(photos, photos["paths"][0])
    png = {"Content-Type": "image/png"}
    body, headers = multipart("photo", data)
    broken = headers | {"Content-Type": "multipart/form-data; boundary=zzz"}
    huge = os.urandom(UPLOAD_LIMIT + 1)
    nan_query = json.dumps({"query": [1.0] * 63 + [float("nan")]})  # not JSON
    return [
        ("POST", "/search", b"not a picture", png, 415, "not a picture"),
        ("POST", "/search", data[: len(data) // 2], png, 415, "truncated"),
        ("POST", "/search", b"", png, 400, "empty body"),
        ("POST", "/search", huge, png, 413, "larger than 50,000 bytes"),
        # A multipart upload names the picture's limit (/stats), not the
        # room its fields take beside it.
        ("POST", "/search", *multipart("image", huge * 100), 413, "than 50,000 bytes"),
        ("POST", "/search?k=0", data, png, 422, "k must be in [1, 1000]"),
        ("POST", f"/search?k={MAX_K + 1}", data, png, 422, "received 1001"),
        ("POST", "/search?k=ten", data, png, 422, "k: Input should be a valid int"),
        ("POST", "/search", body, headers, 400, "field 'image'"),
        ("POST", "/search", b"--zzz\r\ngarbage", broken, 400, "multipart"),
        ("POST", "/search/query", b"{", {}, 400, "not JSON"),
        ("POST", "/search/query", b"[1, 2]", {}, 422, '"query"'),
        ("POST", "/search/query", b'{"query": [1]}', {}, 422, "list of 64 numbers"),
        ("POST", "/search/query", b'{"query": "x"}', {}, 422, "received str"),
        ("POST", "/search/query", nan_query, {}, 400, "finite"),
        ("POST", "/search/query", json.dumps({"query": [True] * 64}), {}, 422, "float"),
        ("POST", "/search/codes", b'{"codes": [0, 1, 2, 16]}', {}, 422, "[0, 16)"),
        ("POST", "/search/codes", b'{"codes": [0.5, 1, 2, 3]}', {}, 422, "int"),
        ("GET", "/items/123456", None, {}, 404, "no item with id 123456"),
        ("GET", "/items/-3", None, {}, 404, "no item"),
        ("GET", "/items/abc", None, {}, 422, "valid integer"),
        ("GET", "/items/99999999999999999999999", None, {}, 404, "no item"),
        ("GET", "/items/..%2F..%2Fetc%2Fpasswd", None, {}, 404, "Not Found"),
        ("GET", "/nowhere", None, {}, 404, "Not Found"),
        ("GET", "/search", None, {}, 405, "Method Not Allowed"),
    ]


def test_every_bad_request_is_a_4xx_json_and_the_server_stays_up(photos, served):
    port, _ = served
    for method, path, body, headers, expected, message in _bad_requests(photos):
        status, answer = request_json(port, method, path, body, headers)
        assert status == expected, (path, answer)
        assert message in answer["error"], (path, answer)
        assert request(port, "GET", "/health")[0] == 200
    # Without a Content-Length (chunked), the limit holds too.
    status, _, body = request(
        port,
        "POST",
        "/search",
        iter([b"x" * 30_000, b"x" * 30_000]),
        {"Content-Type": "image/png"},
        chunked=True,
    )
    assert status == 413 and b"larger than" in body


def test_files_that_left_the_folder_are_never_served(photos, tmp_path):
    root = tmp_path / "photos"
    paths = picture_folder(root, n=6)
    index, _ = retrieval.index_folder(load_subic(photos["model"]), root)
    index.save(tmp_path / "x.subic")
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"secret")
    (root / paths[0]).unlink()
    (root / paths[0]).symlink_to(secret)  # replaced by a link out of the folder
    (root / paths[1]).unlink()  # deleted
    service = SearchService(photos["model"], str(tmp_path / "x.subic"))
    with ThreadServer(service) as port:
        (first, second) = service.index.ids(paths[:2])
        assert request_json(port, "GET", f"/items/{first}") == (
            403,
            {"error": f"item {first} lies outside the folder"},
        )
        status, answer = request_json(port, "GET", f"/items/{second}")
        assert status == 404 and "is gone" in answer["error"]


def test_reload_swaps_the_index_without_dropping_requests(photos, tmp_path):
    root = tmp_path / "photos"
    paths = picture_folder(root, n=30)
    subic = load_subic(photos["model"])
    index, _ = retrieval.index_folder(subic, root)
    index_path = tmp_path / "photos.subic"
    index.save(index_path)
    service = SearchService(photos["model"], str(index_path))
    query = (root / paths[4]).read_bytes()
    with ThreadServer(service) as port:
        failures, answers = [], []
        stop = threading.Event()

        def client():
            while not stop.is_set():
                status, answer = request_json(
                    port, "POST", "/search?k=3", query, {"Content-Type": "image/png"}
                )
                if status != 200:
                    failures.append(answer)
                answers.append(answer["results"][0]["path"])

        clients = [threading.Thread(target=client) for _ in range(3)]
        for thread in clients:
            thread.start()
        # New pictures arrive and old ones go, between reloads.
        extra = picture_folder(root / "new", n=9, seed=1)
        index, report = retrieval.index_folder(
            subic, root, index=ImageIndex.load(index_path)
        )
        assert report.added == 9 and report.already_indexed == 30
        index.save(index_path)
        assert request_json(port, "POST", "/reload") == (
            200,
            {"status": "reloaded", "items": 39},
        )
        index.remove(paths[10:20])  # not the query
        index.save(index_path)
        time.sleep(0.2)
        assert request_json(port, "POST", "/reload")[1]["items"] == 29
        stop.set()
        for thread in clients:
            thread.join()
        assert not failures and len(answers) > 5
        assert set(answers) == {paths[4]}
        # Ids and paths agree after the reload: every item serves its file.
        for item, path in zip(service.index.get_ids(), service.index.get_paths()):
            status, _, data = request(port, "GET", f"/items/{item}")
            assert status == 200 and data == (root / path).read_bytes()
        new_file = (root / "new" / extra[0]).read_bytes()
        _, answer = request_json(
            port, "POST", "/search?k=1", new_file, {"Content-Type": "image/png"}
        )
        assert answer["results"][0]["path"] == f"new/{extra[0]}"
        # A broken index file on disk: the reload is refused, the old index stays.
        index_path.write_bytes(b"SUBICIDX garbage")
        status, answer = request_json(port, "POST", "/reload")
        assert status == 409 and "the old index stays" in answer["error"]
        assert request_json(port, "GET", "/health")[1]["items"] == 29


def test_serve_command_reloads_on_sighup_and_stops_cleanly(photos, tmp_path):
    index_path = tmp_path / "photos.subic"
    index_path.write_bytes(photos["index"].read_bytes())
    with ServeProcess(photos["model"], str(index_path)) as server:
        _, before = request_json(server.port, "GET", "/stats")
        index = ImageIndex.load(index_path)
        index.remove(index.get_paths()[:5])
        index.save(index_path)
        server.reload_by_signal()
        deadline = time.time() + 30
        while request_json(server.port, "GET", "/health")[1]["items"] != 55:
            assert time.time() < deadline, "SIGHUP did not reload the index"
            time.sleep(0.1)
        _, after = request_json(server.port, "GET", "/stats")
        assert after["loaded_at"] > before["loaded_at"]
    assert server.process.returncode == 0, server.stderr
    assert "serving 60 pictures" in server.stdout and "reloaded" in server.stdout
    assert "Traceback" not in server.stderr


def test_service_refuses_a_model_of_other_codes(photos, tmp_path):
    other = save_model(tmp_path / "other.keras", num_blocks=8, block_size=16)
    with pytest.raises(ValueError, match="holds codes of 4 blocks of 16"):
        SearchService(other, str(photos["index"]))


def test_service_refuses_a_model_of_another_picture_size(photos, tmp_path):
    from subic_keras import build_subic
    from subic_keras.models import backbones

    small = build_subic(backbones.dsh_cnn(input_shape=(16, 16, 3)), 4, 16, 3)
    small.train_model.save(tmp_path / "small.keras")
    with pytest.raises(ValueError, match=r"decoded to \(32, 32, 3\), but the model"):
        SearchService(str(tmp_path / "small.keras"), str(photos["index"]))


def test_a_bug_of_ours_is_still_a_json_answer(served, monkeypatch, caplog):
    port, service = served

    def broken(query, k, where=None):
        raise RuntimeError("a bug")

    monkeypatch.setattr(service, "search_query", broken)
    status, answer = request_json(
        port, "POST", "/search/query", json.dumps({"query": [0.0] * 64})
    )
    assert (status, answer) == (500, {"error": "internal error (RuntimeError)"})
    assert request(port, "GET", "/health")[0] == 200


def _folder_index(photos, root, n=6):
    """A fresh folder of `n` pictures under `root` and its index file."""
    names = picture_folder(root, n=n)
    index, _ = retrieval.index_folder(load_subic(photos["model"]), root)
    index.save(root.parent / "folder.subic")
    return names, str(root.parent / "folder.subic")


def test_a_link_swapped_during_requests_serves_no_outside_byte(photos, tmp_path):
    root = tmp_path / "photos"
    names, index_path = _folder_index(photos, root)
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"SECRET" * 1000)
    target = root / names[0]
    inside = target.read_bytes()
    service = SearchService(photos["model"], index_path)
    (item,) = service.index.ids(names[:1])
    statuses: dict[int, int] = {}
    with ThreadServer(service) as port, link_swapped(target, inside, secret):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for _ in range(3000):
            connection.request("GET", f"/items/{item}")
            response = connection.getresponse()
            body = response.read()
            assert b"SECRET" not in body
            if response.status == 200:
                assert body == inside
            statuses[response.status] = statuses.get(response.status, 0) + 1
        connection.close()
    assert set(statuses) <= {200, 403, 404} and statuses.get(200), statuses


def _forged(photos, tmp_path, root: str, relative: str) -> str:
    """An index file whose stored folder and path are `root` and `relative`."""
    from subic_keras.search import file_format, packing

    header = file_format.Header(4, 16, 1, None)
    metadata = {"format": "subic.image-index", "root": root, "next_id": 1}
    metadata["image_shape"] = [32, 32, 3]
    items = file_format.Items(
        metadata, [relative], np.zeros(1, np.uint64), np.zeros(1), [None]
    )
    packed = packing.pack(np.zeros((1, 4), np.int64), 4)
    path = str(tmp_path / f"forged{abs(hash(root)) % 1000}.subic")
    file_format.write(path, header, [packed], np.zeros(1, np.int64), items)
    return path


def test_forged_stored_folders_are_refused_at_load_and_reload(photos, tmp_path):
    with pytest.raises(ValueError, match="whole file system"):
        SearchService(photos["model"], _forged(photos, tmp_path, "/", "etc/passwd"))
    with pytest.raises(ValueError, match="not an absolute path"):
        SearchService(photos["model"], _forged(photos, tmp_path, "", "etc/passwd"))
    with pytest.raises(ValueError, match="not an absolute path"):
        SearchService(photos["model"], _forged(photos, tmp_path, "/tmp\0x", "a.png"))
    # --folder confirms the folder: an index of another one is refused.
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ValueError, match="records the folder"):
        SearchService(photos["model"], str(photos["index"]), folder=other)
    root = tmp_path / "photos"
    _, index_path = _folder_index(photos, root)
    service = SearchService(photos["model"], index_path, folder=root)
    with ThreadServer(service) as port:
        forged = _forged(photos, tmp_path, str(tmp_path), "photos/../../etc/passwd")
        os.replace(forged, index_path)
        status, answer = request_json(port, "POST", "/reload")
        assert status == 409 and "the old index stays" in answer["error"]
        os.replace(_forged(photos, tmp_path, "/", "etc/passwd"), index_path)
        status, answer = request_json(port, "POST", "/reload")
        assert status == 409 and "records the folder '/'" in answer["error"]
        health = request_json(port, "GET", "/health")[1]
        assert health["status"] == "degraded" and health["items"] == 6
        assert health["reload"]["state"] == "failed"
        status, _, data = request(port, "GET", "/items/0")
        assert status == 200 and b"root:" not in data


def test_reloads_cannot_wedge_the_server(photos, tmp_path, monkeypatch):
    root = tmp_path / "photos"
    names, index_path = _folder_index(photos, root)
    service = SearchService(photos["model"], index_path, reload_seconds=1)
    query = (root / names[2]).read_bytes()
    png = {"Content-Type": "image/png"}
    with ThreadServer(service) as port:
        # A FIFO in the index file's place: refused at once.
        os.remove(index_path)
        os.mkfifo(index_path)
        start = time.perf_counter()
        status, answer = request_json(port, "POST", "/reload")
        assert status == 409 and "not a regular file" in answer["error"]
        assert time.perf_counter() - start < 5
        # A reload that hangs (a slow disk): answered after reload_seconds,
        # then every further reload is refused at once, and searches go on.
        os.remove(index_path)
        release = threading.Event()
        load = ImageIndex.load

        def slow_load(*args, **kwargs):
            release.wait(60)
            return load(*args, **kwargs)

        monkeypatch.setattr(ImageIndex, "load", slow_load)
        status, answer = request_json(port, "POST", "/reload")
        assert status == 503 and "still running" in answer["error"]
        start = time.perf_counter()
        for _ in range(45):
            status, answer = request_json(port, "POST", "/reload")
            assert status == 409 and "running already" in answer["error"]
        for _ in range(5):
            status, answer = request_json(port, "POST", "/search?k=2", query, png)
            assert status == 200 and answer["results"][0]["path"] == names[2]
            status, _, _ = request(port, "GET", "/items/1")
            assert status == 200
        assert time.perf_counter() - start < 20
        health = request_json(port, "GET", "/health")[1]
        assert health["status"] == "degraded" and health["reload"]["state"] == "stuck"
        release.set()  # the disk answers: the reload ends, failing (no file)
        deadline = time.time() + 30
        while request_json(port, "GET", "/health")[1]["reload"]["state"] != "failed":
            assert time.time() < deadline
            time.sleep(0.05)
        assert request_json(port, "GET", "/health")[1]["items"] == 6


def test_large_pictures_are_refused_from_the_header(photos):
    from benchmarks.bombs import GREY, png_bomb

    service = SearchService(photos["model"], str(photos["index"]))
    png = {"Content-Type": "image/png"}
    for data, message in (
        (png_bomb(10_000, 10_000, 16, GREY), "more than the 128 MB"),
        (png_bomb(15_000, 15_000), "225,000,000 pixels"),
    ):
        with ThreadServer(service) as port:
            start = time.perf_counter()
            status, answer = request_json(port, "POST", "/search", data, png)
            assert status == 413 and message in answer["error"], answer
            assert time.perf_counter() - start < 2


def test_requests_beyond_the_parsers_limits_are_4xx(photos, served, caplog):
    port, _ = served
    deep = b"[" * 100_000 + b"]" * 100_000
    cases = [
        (b'{"query": ' + deep + b"}", 400, "nested"),
        (b'{"query": [' + b"9" * 5000 + b"]}", 400, "characters"),
        (json.dumps({"query": [1e39] + [0.0] * 63}), 422, "float32"),
        (json.dumps({"query": [3.4e38] * 64}), 422, "float32"),
        (json.dumps({"query": [1e308] + [0.0] * 63}), 422, "float32"),
        (json.dumps({"query": [10**300] + [0] * 63}), 400, "characters"),
        (json.dumps({"query": [1e300] + [0] * 63}), 422, "float32"),
        (b'{"query": [NaN]}', 400, "not JSON"),
    ]
    for body, expected, message in cases:
        status, answer = request_json(port, "POST", "/search/query", body)
        assert status == expected and message in answer["error"], answer
    data = _picture(photos, photos["paths"][0])
    body, headers = multipart("image", data)
    status, answer = request_json(port, "POST", "/search", body[:-40], headers)
    assert status == 400 and "closing boundary" in answer["error"]
    # A client that leaves mid-upload: one line in the log, no traceback.
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(
            b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
            b"Content-Length: 40000\r\n\r\n" + data[:1000]
        )
    time.sleep(0.5)
    assert request(port, "GET", "/health")[0] == 200
    assert not [r for r in caplog.records if r.exc_info], caplog.text


def test_serve_listens_where_it_says(photos, tmp_path):
    """--port 0 prints the port it bound; a wildcard host warns; a busy port
    is one line and exit 2 before anything is served."""
    command = [
        sys.executable, "-m", "subic_keras.cli", "serve", photos["model"],
        str(photos["index"]),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        [*command, "--port", "0", "--host", "0.0.0.0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        line = process.stdout.readline()
        port = int(line.split("http://0.0.0.0:")[1].split("/")[0])
        assert port > 0 and request(port, "GET", "/health")[0] == 200
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            taken = busy.getsockname()[1]
            start = time.perf_counter()
            refused = subprocess.run(
                [*command, "--port", str(taken)],
                capture_output=True, text=True, env=env, timeout=120,
            )  # fmt: skip
        assert refused.returncode == 2 and "serving" not in refused.stdout
        assert refused.stderr.strip().splitlines() == [
            f"subic serve: error: cannot listen on 127.0.0.1:{taken}: Address "
            "already in use"
        ]
        assert time.perf_counter() - start < 60
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    assert "warning: listening on every network interface (0.0.0.0)" in err
    assert process.returncode == 0 and "Traceback" not in err


def test_bombs_one_and_three_at_once_stay_within_200_mb_of_idle(tmp_path):
    from benchmarks import decode_memory

    rows = decode_memory.run(str(tmp_path))
    assert len(rows) == 6
    for row in rows:
        assert row["peak_over_idle_mb"] <= decode_memory.LIMIT_MB, row
        expected = 200 if row["picture"] == "RGB PNG 5000x2000" else 413
        assert row["statuses"] == [expected] * row["copies"], row


def test_an_index_with_instance_codes_serves_copies_first(tmp_path, shared_data_dir):
    from PIL import Image

    from subic_keras.data.datasets import load_cifar10
    from subic_keras.instance.instance_code import InstanceSubic

    (_, _), (x_test, y_test) = load_cifar10(shared_data_dir)
    root = tmp_path / "photos"
    paths = write_image_folder(x_test[:40], y_test[:40] % 3, root, ["a", "b", "c"])
    model = save_model(tmp_path / "model.keras")
    ruled = ruled_instance(tmp_path / "ruled.keras")  # marks copies
    index, _ = retrieval.index_folder(
        load_subic(model), root, instance=InstanceSubic.load(ruled), instance_path=ruled
    )
    index.save(tmp_path / "photos.subic")
    service = SearchService(model, str(tmp_path / "photos.subic"))
    assert service.stats()["instance_codes"] and "looks" not in service.stats()
    copy = io.BytesIO()
    Image.open(root / paths[7]).resize((64, 64), Image.BICUBIC).save(copy, "JPEG")
    results = service.search_image(copy.getvalue(), 5)["results"]
    assert results[0]["path"] == paths[7] and results[0]["copy"]
    assert not results[0]["exact"] and "lifted" not in results[0]
    assert not any(row["copy"] for row in results[1:])
    # A reload keeps the instance code loaded; the instance code alone
    # serves the same index by its instance codes.
    loaded = service._state.instance
    assert service.reload()["items"] == 40 and service._state.instance is loaded
    alone = SearchService(ruled, str(tmp_path / "photos.subic"))
    answer = alone.search_image(copy.getvalue(), 1)
    assert answer["results"][0]["path"] == paths[7] and answer["class_name"] is None
    assert alone.stats()["bits"] == 256 and not alone.stats()["instance_codes"]
