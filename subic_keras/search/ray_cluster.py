"""Ray, found or started: `ray_module` joins the cluster a command names,
or starts one here, and says in one line, within seconds, when the cluster
named does not answer (a stale cluster file left by another process would
otherwise keep Ray waiting for minutes)."""

from __future__ import annotations

import logging
import os

from subic_keras.data.paths import read_bytes


def ray_module(address: str | None = None, probe_seconds: float = 5.0):
    """Ray, initialized (joining `address` if it is not yet).

    `address` as `ray.init` takes it: `None` or `"auto"` joins the cluster
    `RAY_ADDRESS` or Ray's cluster file (the last `ray start` on this
    machine) names, else starts one here; `"local"` always starts one here.
    A cluster named so is asked first, within `probe_seconds`: one that no
    longer answers (a stale cluster file) is said in one line instead of
    Ray waiting for it for minutes.

    Raises:
        ImportError: without Ray, naming the extra that installs it.
        ConnectionError: the cluster named does not answer.
    """
    try:
        import ray
    except ImportError as error:
        raise ImportError(
            "shards are searched and built with Ray: pip install 'subic-keras[ray]'"
        ) from error
    if not ray.is_initialized():
        _probe_cluster(address, probe_seconds)
        ray.init(
            address=address,
            log_to_driver=False,
            include_dashboard=False,
            logging_level=logging.ERROR,  # a command's output stays its own
        )
    _cluster_messages_to_stderr(ray)
    return ray


def _cluster_messages_to_stderr(ray) -> None:
    """Sends the messages Ray's driver prints for the cluster to stderr.

    Whatever `log_to_driver` says, a driver prints the raylet's warnings
    ("4 PYTHON worker processes have been started on node ...") to stdout,
    where they would land among a command's answers (`--json` lines). Ray
    exposes no option for it: its printing function is wrapped, where this
    version of Ray has it.
    """
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    printing = getattr(worker, "print_to_stdstream", None)
    if worker is None or printing is None or getattr(printing, "to_stderr", False):
        return

    def to_stderr(data, ignore_prefix):
        return printing({**data, "is_err": True}, ignore_prefix)

    to_stderr.to_stderr = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr


def _probe_cluster(address: str | None, seconds: float) -> None:
    """Raises `ConnectionError` where the cluster `ray.init(address)` would
    join does not accept a connection within `seconds`."""
    import socket

    named = f"--ray-address {address}"
    if address in (None, "auto"):
        named, address = "RAY_ADDRESS", os.environ.get("RAY_ADDRESS") or None
    if address is None:
        named, address = _cluster_file()
    if address in (None, "", "local", "auto") or "://" in address:
        return  # a local start, or a Ray Client address Ray itself resolves
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return  # Ray refuses it with its own message
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=seconds).close()
    except OSError as error:
        reason = "no answer" if isinstance(error, TimeoutError) else error.strerror
        raise ConnectionError(
            f"the Ray cluster at {address} ({named}) does not answer "
            f"({reason or error}); give --ray-address local to start one on this "
            "machine, or the address of a running cluster"
        ) from None


def _cluster_file() -> tuple[str, str | None]:
    """Ray's file naming the last cluster started on this machine, and the
    address it holds (`None` without one)."""
    try:
        from ray._common.utils import get_default_ray_temp_dir

        folder = get_default_ray_temp_dir()
    except ImportError:  # where Ray keeps it elsewhere: its usual place
        folder = os.path.join(os.environ.get("RAY_TMPDIR", "/tmp"), "ray")
    path = os.path.join(folder, "ray_current_cluster")
    try:
        text = read_bytes(path, 4096, "Ray cluster file").decode().strip()
    except (OSError, ValueError):
        return path, None
    return f"the cluster file {path}", text or None
