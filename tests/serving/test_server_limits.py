"""Tests for subic_keras.serving.server that trust no request or file: every
bad request a 4xx JSON answer, decodes and parses bounded, and no byte
served from outside the folder, over real HTTP."""

import http.client
import json
import os
import socket
import time

import numpy as np
import pytest
from served import (
    UPLOAD_LIMIT,
    ThreadServer,
    folder_index,
    multipart,
    picture_folder,
    request,
    request_json,
)
from swapping import link_swapped

from subic_keras.serving import retrieval
from subic_keras.serving.export import load_subic
from subic_keras.serving.server import MAX_K, SearchService

# Integration tests (processes, servers, exports): `-m "not slow"` skips them.
pytestmark = pytest.mark.slow


def _picture(photos, path: str) -> bytes:
    return (photos["root"] / path).read_bytes()


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


def test_a_link_swapped_during_requests_serves_no_outside_byte(photos, tmp_path):
    root = tmp_path / "photos"
    names, index_path = folder_index(photos, root)
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
    _, index_path = folder_index(photos, root)
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


def test_bombs_one_and_three_at_once_stay_within_200_mb_of_idle(tmp_path):
    from benchmarks import decode_memory

    rows = decode_memory.run(str(tmp_path))
    assert len(rows) == 6
    for row in rows:
        assert row["peak_over_idle_mb"] <= decode_memory.LIMIT_MB, row
        expected = 200 if row["picture"] == "RGB PNG 5000x2000" else 413
        assert row["statuses"] == [expected] * row["copies"], row
