"""Tests for subic_keras.serving.server: the REST API of `subic serve`, over
real HTTP: searches, items, stats, refused models, the listening address.

Its limits and its trust in files are in test_server_limits.py, its reloads
in test_server_reload.py."""

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse

import numpy as np
import pytest
from served import (
    ThreadServer,
    multipart,
    request,
    request_json,
    ruled_instance,
    save_model,
)

from subic_keras.data.images import write_image_folder
from subic_keras.serving import retrieval
from subic_keras.serving.export import load_subic
from subic_keras.serving.server import SearchService

# Integration tests (processes, servers, exports): `-m "not slow"` skips them.
pytestmark = pytest.mark.slow


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
