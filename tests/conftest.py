"""Shared pytest fixtures."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import sys
from pathlib import Path

import numpy as np
import pytest

# Before any test module imports TensorFlow: keep its C++ logging quiet.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# faiss's OpenMP threads spin while waiting; on a small shared machine that
# starves TensorFlow and slows faiss itself by orders of magnitude.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# As many pytest-xdist workers as cores: one TensorFlow and OpenMP thread per
# process (subprocesses and notebook kernels inherit it), so that the workers
# do not oversubscribe the cores. Tests that need threads (the native
# scan's, faiss's `in_threads`) set their own counts.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) >= (os.cpu_count() or 1):
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# pymilvus configures logging when imported (`logging.config.dictConfig`),
# which closes every handler then open. absl's handler (TensorFlow loads it)
# closes its stream when that is no longer `sys.stderr`: under pytest, the
# capture buffer of an earlier phase, and pytest's capture then fails on a
# closed file. Imported first, pymilvus finds no handler to close.
if importlib.util.find_spec("pymilvus") is not None:
    import pymilvus  # noqa: F401


@pytest.fixture(scope="session", autouse=True)
def pretraining_cache(tmp_path_factory) -> Path:
    """`subic train` caches pre-trained backbones here, not in the home dir."""
    path = tmp_path_factory.mktemp("subic-cache")
    previous = os.environ.get("SUBIC_CACHE_DIR")
    os.environ["SUBIC_CACHE_DIR"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("SUBIC_CACHE_DIR", None)
    else:
        os.environ["SUBIC_CACHE_DIR"] = previous


DATA_SKIP = (
    "needs SUBIC_DATA_DIR: a folder holding cifar-10-batches-bin/, "
    "fashion-mnist/ and mobilenet/ (README.md, section Tests)"
)


def pytest_collection_modifyitems(config, items):
    """Modules with slow tests first, each module kept whole (its fixtures
    are made once): with `-n 2`, the long tests start early and the short
    ones fill the workers' ends, instead of a long test starting last."""

    def module(item):
        return getattr(item, "module", None)

    slow = {module(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: module(item) not in slow)


def pytest_terminal_summary(terminalreporter):
    """Says how many tests were skipped for want of the data directory, and
    how the fuzz cases (tests/fuzz/) ended, by expected outcome."""
    outcomes: dict[tuple[str, str], int] = {}
    for status in ("passed", "failed"):
        for report in terminalreporter.stats.get(status, []):
            kind = dict(getattr(report, "user_properties", ())).get("fuzz_outcome")
            if kind and report.when == "call":
                outcomes[(kind, status)] = outcomes.get((kind, status), 0) + 1
    if outcomes:
        counts = ", ".join(
            f"{count} {kind} ({status})"
            for (kind, status), count in sorted(outcomes.items())
        )
        terminalreporter.write_line(f"fuzz cases by expected outcome: {counts}")
    skipped = terminalreporter.stats.get("skipped", [])
    wanting = [r for r in skipped if DATA_SKIP in str(getattr(r, "longrepr", ""))]
    if wanting:
        terminalreporter.write_line(
            f"{len(wanting)} tests skipped: they need the data directory in "
            "SUBIC_DATA_DIR (README.md, section Tests)"
        )


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The offline data directory: `$SUBIC_DATA_DIR`, or `shared/data` beside
    the repository; the test is skipped when it is absent."""
    default = Path(__file__).resolve().parents[2] / "shared" / "data"
    path = Path(os.environ.get("SUBIC_DATA_DIR", default))
    if not path.is_dir():
        pytest.skip(f"{DATA_SKIP}; not found: {path}")
    return path


@pytest.fixture(scope="session")
def load_benchmark():
    """Imports a script of `benchmarks/` by file name, e.g. `"cross_domain"`."""

    def load(name: str):
        return importlib.import_module(f"benchmarks.{name}")

    return load


@pytest.fixture(scope="session")
def run_benchmark(load_benchmark):
    """Runs `python -m benchmarks.<name> *argv` in this process: its `main()`
    with `sys.argv` as that command line sets it (the command recorded in
    its JSON included), without starting TensorFlow in another process.
    Returns what it printed."""

    def run(name: str, *argv) -> str:
        module = load_benchmark(name)
        printed = io.StringIO()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "argv", [module.__file__, *map(str, argv)])
            with contextlib.redirect_stdout(printed):
                module.main()
        return printed.getvalue()

    return run


@pytest.fixture(scope="session")
def mirrored_checks() -> dict:
    """What `tests/distribute_check.py` measured under a 2-replica
    `MirroredStrategy`: `{"losses": ..., "recipe": ...}`. One process for both
    (the tests that read it are in the xdist group "mirrored")."""
    import json
    import subprocess

    tests = Path(__file__).resolve().parent
    path = os.pathsep.join(
        filter(None, [str(tests.parent), os.environ.get("PYTHONPATH")])
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, str(tests / "distribute_check.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def feature_data():
    """640 16-d features in 4 separable classes: `(features, labels)`."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 160)
    features = rng.normal(size=(640, 16)).astype(np.float32) + labels[:, None]
    return features, labels


@pytest.fixture(scope="module")
def feature_subic():
    """An untrained SuBiC (M = 4, K = 8, 4 classes) on 16-d features."""
    from subic_keras.models.backbones import feature_input
    from subic_keras.models.building import build_subic

    return build_subic(feature_input(16), 4, 8, 4, input_shape=(16,))


_RAY_CLUSTER: list = []  # `[(cluster, workers)]` while one runs


@pytest.fixture(scope="module")
def ray_cluster():
    """A Ray head and two worker nodes of one CPU each, all on this machine
    (`ray.cluster_utils.Cluster`), joined by this process: `(cluster,
    workers)`. The tests that use it are in the xdist group "ray", so one
    worker runs them all, one after the other, on one cluster; it stops
    after the last of them (`pytest_runtest_teardown`), since an idle
    cluster's processes take CPU time from the rest of the run."""
    ray = pytest.importorskip("ray", reason="the [ray] extra")
    if not _RAY_CLUSTER:
        from ray import cluster_utils

        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        cluster = cluster_utils.Cluster(
            initialize_head=True, head_node_args={"num_cpus": 1}
        )
        workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        _RAY_CLUSTER.append((cluster, workers))
    return _RAY_CLUSTER[0]


def _stop_ray_cluster() -> None:
    if _RAY_CLUSTER:
        import ray

        cluster, _ = _RAY_CLUSTER.pop()
        ray.shutdown()
        cluster.shutdown()


def _in_ray_group(item) -> bool:
    marker = item.get_closest_marker("xdist_group")
    return marker is not None and marker.args[:1] == ("ray",)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    # Once the module fixtures that used it are finalized: the cluster stops
    # when the next test is not of the group "ray" (`--dist loadgroup` runs
    # the group's modules in one stretch; a later one starts a new cluster).
    if _RAY_CLUSTER and (nextitem is None or not _in_ray_group(nextitem)):
        _stop_ray_cluster()
