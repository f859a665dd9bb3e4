"""Tests for subic_keras.server: the REST API of `subic serve`, over real HTTP."""

import json
import os
import threading
import time

import numpy as np
import pytest
from served import (
    ServeProcess,
    ThreadServer,
    multipart,
    picture_folder,
    request,
    request_json,
    save_model,
)

from subic_keras import retrieval
from subic_keras.export import load_subic
from subic_keras.search.image_index import ImageIndex
from subic_keras.server import MAX_K, SearchService

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
    code = service.index.index.get_codes([5])[0].tolist()
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


def test_health_stats_and_page(served):
    port, _ = served
    assert request_json(port, "GET", "/health") == (200, {"status": "ok", "items": 60})
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
    nan_query = json.dumps({"query": [1.0] * 63 + [float("nan")]})
    return [
        ("POST", "/search", b"not a picture", png, 415, "not a picture"),
        ("POST", "/search", data[: len(data) // 2], png, 415, "truncated"),
        ("POST", "/search", b"", png, 400, "empty body"),
        ("POST", "/search", huge, png, 413, "larger than 50000"),
        ("POST", "/search?k=0", data, png, 422, "k must be in [1, 1000]"),
        ("POST", f"/search?k={MAX_K + 1}", data, png, 422, "received 1001"),
        ("POST", "/search?k=ten", data, png, 422, "k: Input should be a valid int"),
        ("POST", "/search", body, headers, 400, "field 'image'"),
        ("POST", "/search", b"--zzz\r\ngarbage", broken, 400, "multipart"),
        ("POST", "/search/query", b"{", {}, 400, "not JSON"),
        ("POST", "/search/query", b"[1, 2]", {}, 422, '"query"'),
        ("POST", "/search/query", b'{"query": [1]}', {}, 422, "list of 64 numbers"),
        ("POST", "/search/query", b'{"query": "x"}', {}, 422, "received str"),
        ("POST", "/search/query", nan_query, {}, 422, "finite"),
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
    from subic_keras import backbones, build_subic

    small = build_subic(backbones.dsh_cnn(input_shape=(16, 16, 3)), 4, 16, 3)
    small.train_model.save(tmp_path / "small.keras")
    with pytest.raises(ValueError, match=r"decoded to \(32, 32, 3\), but the model"):
        SearchService(str(tmp_path / "small.keras"), str(photos["index"]))


def test_a_bug_of_ours_is_still_a_json_answer(served, monkeypatch, caplog):
    port, service = served

    def broken(query, k):
        raise RuntimeError("a bug")

    monkeypatch.setattr(service, "search_query", broken)
    status, answer = request_json(
        port, "POST", "/search/query", json.dumps({"query": [0.0] * 64})
    )
    assert (status, answer) == (500, {"error": "internal error (RuntimeError)"})
    assert request(port, "GET", "/health")[0] == 200
