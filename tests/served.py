"""Helpers of the serving tests: a picture folder, a model, a live server."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import numpy as np

from subic_keras.data.images import write_image_folder

# The upload limit of the servers that tests/serving/conftest.py starts.
UPLOAD_LIMIT = 50_000


def picture_folder(root, n: int = 60, seed: int = 0) -> list[str]:
    """`n` random 32×32 RGB PNGs in 3 class folders; their relative paths."""
    rng = np.random.default_rng(seed)
    pictures = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
    return write_image_folder(pictures, np.arange(n) % 3, root, ["a", "b", "c"])


def folder_index(photos, root, n: int = 6) -> tuple[list[str], str]:
    """A fresh folder of `n` pictures under `root` and its index file."""
    from subic_keras.serving import retrieval
    from subic_keras.serving.export import load_subic

    names = picture_folder(root, n=n)
    index, _ = retrieval.index_folder(load_subic(photos["model"]), root)
    index.save(root.parent / "folder.subic")
    return names, str(root.parent / "folder.subic")


def save_model(path, num_blocks: int = 4, block_size: int = 16) -> str:
    """An untrained SuBiC model on 32×32 RGB pictures, saved to `path`."""
    from subic_keras import build_subic
    from subic_keras.models import backbones

    subic = build_subic(backbones.dsh_cnn(), num_blocks, block_size, 3)
    subic.train_model.save(path)
    return str(path)


# The copy rules the shipped instance code chose on validation
# (benchmarks/results/near_duplicates.json, "calibration").
COPY_MARGIN, COPY_BLOCKS = -18.272015, 61


def ruled_instance(path) -> str:
    """The shipped instance code with its copy rules (`COPY_MARGIN`,
    `COPY_BLOCKS`, checked here), saved at `path`: what marks copies and
    lists duplicates by the model's own rules, to test."""
    from subic_keras.instance.instance_code import pretrained

    code = pretrained()
    assert (code.copy_margin, code.copy_blocks) == (COPY_MARGIN, COPY_BLOCKS)
    code.save(path)
    return str(path)


def request(port: int, method: str, path: str, body=None, headers=None, chunked=False):
    """`(status, content type, body bytes)` of one HTTP request to loopback."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(
            method, path, body=body, headers=headers or {}, encode_chunked=chunked
        )
        response = connection.getresponse()
        return response.status, response.getheader("content-type", ""), response.read()
    finally:
        connection.close()


def request_json(port: int, method: str, path: str, body=None, headers=None):
    status, content_type, data = request(port, method, path, body, headers)
    assert content_type.startswith("application/json"), (status, content_type, data)
    return status, json.loads(data)


def multipart(field: str, data: bytes, filename: str = "query.png", **texts):
    """`(body, headers)` of a multipart/form-data upload of one file, and
    of text fields `texts`."""
    boundary = uuid.uuid4().hex
    body = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
        f"{text}\r\n".encode()
        for name, text in texts.items()
    ) + (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; '
            f'filename="{filename}"\r\nContent-Type: image/png\r\n\r\n'
        ).encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


class ThreadServer:
    """`http_app.create_app(service)` under uvicorn in a thread, on a free port."""

    def __init__(self, service):
        import uvicorn

        from subic_keras.serving.http_app import create_app, server_config

        config = server_config(create_app(service), host="127.0.0.1", port=0)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> int:
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.05)
        return self.server.servers[0].sockets[0].getsockname()[1]

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServeProcess:
    """`subic serve MODEL INDEX` as a child process, stopped on exit."""

    def __init__(self, model: str, index: str, *options: str):
        self.port = free_port()
        self.command = [
            sys.executable, "-m", "subic_keras.cli", "serve", model, index,
            "--port", str(self.port), *options,
        ]  # fmt: skip

    def __enter__(self) -> ServeProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        deadline = time.time() + 120
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"subic serve exited: {self.process.stderr.read()}")
            try:
                if request(self.port, "GET", "/health")[0] == 200:
                    return self
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("subic serve did not answer within 120 s")
            time.sleep(0.2)

    def reload_by_signal(self) -> None:
        self.process.send_signal(signal.SIGHUP)

    def __exit__(self, *exc):
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.stdout = self.process.stdout.read()
        self.stderr = self.process.stderr.read()
