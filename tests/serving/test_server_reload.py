"""Tests for subic_keras.serving.server's reloads: `POST /reload` and
SIGHUP swap the index without dropping requests, and cannot wedge it."""

import os
import threading
import time

import pytest
from served import (
    ServeProcess,
    ThreadServer,
    folder_index,
    picture_folder,
    request,
    request_json,
)

from subic_keras.search.image_index import ImageIndex
from subic_keras.serving import retrieval
from subic_keras.serving.export import load_subic
from subic_keras.serving.server import SearchService

# Integration tests (processes, servers, exports): `-m "not slow"` skips them.
pytestmark = pytest.mark.slow


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


def test_reloads_cannot_wedge_the_server(photos, tmp_path, monkeypatch):
    root = tmp_path / "photos"
    names, index_path = folder_index(photos, root)
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
