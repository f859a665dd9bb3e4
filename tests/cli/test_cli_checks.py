"""A user's mistake on the command line costs a second, not TensorFlow's
start-up: every one below is one line on stderr, exit status 2, before
TensorFlow is imported."""

import json
import os
import socket
import subprocess
import sys
import textwrap

MISTAKES = [
    (["search", "{missing}", "index.subic", "q.png"], "model file not found"),
    (["search", "{text}", "index.subic", "q.png"], "not a Keras model file"),
    (["search", "{folder}", "index.subic", "q.png"], "a directory, not a model file"),
    (["search", "{text}", "index.subic", "q.png", "-k", "0"], "-k must be >= 1"),
    (
        ["search", "{text}", "index.subic", "q.png", "--scanner", "fast"],
        "--scanner must be one of auto, native-vbmi",
    ),
    (["search", "{loop}", "index.subic", "q.png"], "a loop of symbolic links"),
    (["search", "/dev/zero", "index.subic", "q.png"], "not a regular file"),
    (["search", "{fifo}", "index.subic", "q.png"], "not a regular file"),
    (["search", "{text}/m.keras", "i.subic", "q.png"], "a file where a folder belongs"),
    (["train", "--bits", "10"], "--bits must be a multiple of log2(--block-size)"),
    (["train", "--images", "{missing}"], "not found"),
    (["train", "--images", "{planted}/flat"], "needs one subfolder per class"),
    (["train", "--dataset", "cifar10", "--data-dir", "{missing}"], "data directory"),
    (["evaluate", "{text}", "--queries-per-class", "0"], "--queries-per-class must be"),
    (
        ["evaluate", "{text}", "--protocol", "paper", "--num-queries", "20"],
        "--num-queries cannot go with --protocol paper",
    ),
    (["evaluate", "{model}", "--index", "{missing}"], "index file not found"),
    (
        ["search", "{model}", "{missing}.db", "q.png", "--collection", "photos"],
        "collection 'photos' does not exist",
    ),
    (
        ["evaluate", "{model}", "--index", "{missing}.db"],
        "no Milvus Lite database at that path",
    ),
    (
        ["index", "build", "{model}", "--output", "{missing}/x.subic"],
        "the folder of the output file does not exist",
    ),
    (["index", "build", "{model}"], "give --output INDEX"),
    (
        ["search", "{model}", "grpc://localhost:19530", "q.png"],
        "grpc:// is not an address pymilvus takes",
    ),
    (["search", "{model}", "unix:", "q.png"], "a unix: address names the server"),
    (["search", "{model}", "http://", "q.png"], "names no valid host"),
    (["search", "{model}", "tcp://h:99999", "q.png"], "port must be in [1, 65535]"),
    (["index", "remove", "{model}", "x.png", "--force"], "--force goes with"),
    (["serve", "{model}", "{text}", "--host", ""], "--host must name an address"),
    (["serve", "{model}", "{text}", "--max-upload-mb", "inf"], "--max-upload-mb"),
    (["serve", "{model}", "{text}", "--port", "70000"], "--port must be <= 65535"),
    (["export", "{model}", "--output-dir", "{text}"], "is not a directory"),
    (["serve", "{model}", "{text}", "--port", "{busy}"], "Address already in use"),
    (["serve", "{model}", "{text}", "--ray-address", "local"], "--ray-address applies"),
    (["search", "{model}", "{text}", "q.png", "--where", "id =="], "expected a value"),
    # Outputs of `train` planted in its folder: refused, never written through.
    (["train", "--output-dir", "{planted}/summary"], "symbolic link where summary"),
    (["train", "--output-dir", "{planted}/best"], "symbolic link where best.keras"),
    (["train", "--output-dir", "{planted}/logs"], "symbolic link where logs goes"),
    (["quickstart", "--output-dir", "{planted}/logs"], "symbolic link where logs"),
    (["train", "--output-dir", "{planted}/own"], "already holds summary.json"),
    (["quickstart", "--output-dir", "{planted}/file"], "a file named logs"),
    (["index", "build", "{model}", "--output", "{text}"], "not a SuBiC index file"),
    (
        [
            "index",
            "build",
            "{model}",
            "{folder}",
            "--output",
            "{planted}/x.shards.json",
        ],
        "not a shard manifest",
    ),
    (
        ["index", "build", "{model}", "--output", "{planted}/summary/summary.json"],
        "never writes through a link",
    ),
    (["export", "{model}", "--output-dir", "out", "--int8"], "--int8 needs"),
    # A model whose weights are not those the index records.
    (["search", "{other}", "{written}", "q.png"], "their weights differ"),
    (["serve", "{other}", "{written}", "--port", "0"], "their weights differ"),
    (["index", "add", "{other}", "{written}"], "their weights differ"),
]

SCRIPT = textwrap.dedent(
    """
    import contextlib, io, json, sys, time
    from subic_keras.cli import main

    outcomes = []
    for argv in json.loads(sys.argv[1]):
        stderr, start = io.StringIO(), time.perf_counter()
        with contextlib.redirect_stderr(stderr):
            try:
                status = main(argv)
            except SystemExit as exit:
                status = exit.code
        outcomes.append([status, stderr.getvalue(), time.perf_counter() - start])
    print(json.dumps({"outcomes": outcomes, "tf": "tensorflow" in sys.modules}))
    """
)


def _index_of_another_model(folder) -> tuple[str, str]:
    """An index recording one model's weights, and another model's file."""
    import keras

    from subic_keras.models.weights_digest import weights_digest
    from subic_keras.search import SubicIndex

    for name in ("one", "other"):
        inputs = keras.Input((3,))
        keras.Model(inputs, keras.layers.Dense(2)(inputs)).save(
            folder / f"{name}.keras"
        )
    index = SubicIndex(2, 4)
    index.add([[0, 1]])
    index.model = {
        "digest": "a" * 64,
        "path": str(folder / "one.keras"),
        "weights_file": weights_digest(folder / "one.keras"),
    }
    index.save(folder / "written.subic")
    return str(folder / "written.subic"), str(folder / "other.keras")


def test_mistakes_are_one_line_before_tensorflow_loads(tmp_path):
    import zipfile

    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "folder").mkdir()
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    os.mkfifo(tmp_path / "fifo")
    planted = tmp_path / "planted"
    for name, link in (("summary", "summary.json"), ("best", "best.keras")):
        (planted / name).mkdir(parents=True)
        (planted / name / link).symlink_to(tmp_path / "notes.txt")
    (planted / "best" / "best.keras").unlink()
    (planted / "best" / "best.keras").symlink_to(tmp_path / "nowhere")  # dangling
    (planted / "logs").mkdir()
    (planted / "logs" / "logs").symlink_to(tmp_path / "folder")
    (planted / "own").mkdir()
    (planted / "own" / "summary.json").write_text("{}")
    (planted / "file").mkdir()
    (planted / "file" / "logs").write_text("")
    (planted / "x.shards.json").write_text("{}")
    (planted / "flat").mkdir()
    (planted / "flat" / "a.png").write_bytes(b"")
    model = tmp_path / "model.keras"
    with zipfile.ZipFile(model, "w") as archive:
        archive.writestr("config.json", "{}")
    written, other = _index_of_another_model(tmp_path)
    names = {
        "written": written,
        "other": other,
        "missing": str(tmp_path / "missing"),
        "text": str(tmp_path / "notes.txt"),
        "folder": str(tmp_path / "folder"),
        "model": str(model),
        "loop": str(tmp_path / "loop"),
        "fifo": str(tmp_path / "fifo"),
        "planted": str(planted),
    }
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    names["busy"] = str(busy.getsockname()[1])
    argvs = [[arg.format(**names) for arg in argv] for argv, _ in MISTAKES]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(argvs)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    busy.close()
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert not result["tf"], "a mistake loaded TensorFlow"
    outcomes = result["outcomes"]
    for (argv, expected), (status, stderr, seconds) in zip(MISTAKES, outcomes):
        assert status == 2, (argv, stderr)
        assert stderr.count("\n") == 1 and expected in stderr, (argv, stderr)
        assert "Traceback" not in stderr
        assert seconds < 1.0, (argv, seconds)
    assert (tmp_path / "notes.txt").read_text() == "not a model"
    assert not os.listdir(tmp_path / "folder") and not os.path.lexists(
        tmp_path / "nowhere"
    )
