import argparse
import json
import os
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
from limits import with_memory_limit

from subic_keras import Subic
from subic_keras.cli import main

# One worker runs them all (the README's `--dist loadgroup`): the digits model
# most of them use is trained once.
pytestmark = pytest.mark.xdist_group("cli")


def test_train_on_digits(tmp_path, capsys):
    out = tmp_path / "run"
    train = ["train", "--pretrain-epochs", "4", "--epochs", "3", "--block-size", "16"]
    assert main([*train, "--bits", "16", "--output-dir", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["bits"] == 16 and summary["config"]["num_blocks"] == 4
    assert summary["best_epoch"] in (1, 2, 3) and not summary["stopped_on_nan"]
    assert 0.3 < summary["test"]["accuracy_binary"] <= 1.0
    # Both stages are recorded; the digits are too small to augment.
    assert summary["pretrain"]["epochs"] == 4 and not summary["pretrain"]["cached"]
    assert summary["recipe"]["epochs"] == 3 and not summary["recipe"]["augment"]
    assert summary["recipe"]["warmup_fraction"] == pytest.approx(1 / 3)
    assert set(summary["validation_map"]) == {"fc0", "class_posterior"}
    assert sorted(os.listdir(out / "logs")) == ["pretrain", "subic"]
    subic = Subic.from_train_model(keras.saving.load_model(out / "best.keras"))
    assert subic.num_blocks == 4 and subic.block_size == 16
    assert subic.default_query == summary["query"]
    printed = capsys.readouterr().out
    assert "test accuracy" in printed and "saved with the model" in printed

    # Another bit-rate on the same data and seed reuses the pre-training.
    other = tmp_path / "other"
    assert main([*train, "--bits", "8", "--output-dir", str(other)]) == 0
    summary = json.loads((other / "summary.json").read_text())
    assert summary["pretrain"]["cached"] and summary["bits"] == 8
    assert "(cached)" in capsys.readouterr().out


def test_train_defaults_are_the_recipe():
    from subic_keras.cli import build_parser
    from subic_keras.trainers.recipe import Recipe

    args = build_parser().parse_args(["train"])
    recipe = Recipe()
    assert (args.pretrain_epochs, args.epochs) == (recipe.pretrain_epochs, 5)
    assert (args.gamma, args.mu) == (recipe.gamma, recipe.mu)
    assert args.batch_size == recipe.batch_size
    assert args.learning_rate == recipe.learning_rate
    assert (args.num_blocks, args.block_size) == (12, 16)
    assert args.warmup_epochs is None and args.augment is None


@pytest.mark.parametrize(
    "arguments,message",
    [
        (
            ["--bits", "10", "--block-size", "16"],
            "--bits must be a multiple of log2(--block-size) = 4, received 10",
        ),
        (["--block-size", "12"], "--block-size must be a power of two, received 12"),
        (["--block-size", "1"], "--block-size must be >= 2, received 1"),
        (["--gamma", "-1"], "gamma must be a finite number >= 0, received -1.0"),
        (["--epochs", "0"], "epochs must be >= 1, received 0"),
        (["--pretrain-epochs", "-1"], "pretrain_epochs must be >= 0, received -1"),
        (
            ["--epochs", "3", "--warmup-epochs", "4"],
            "warmup_epochs must be at most epochs (3), received 4.0",
        ),
        (
            ["--dataset", "cifar10", "--data-dir", "/nonexistent/cifar"],
            "/nonexistent/cifar",
        ),
    ],
)
def test_train_bad_arguments(arguments, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as raised:
        main(["train", "--output-dir", str(tmp_path), *arguments])
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


def test_console_script_help():
    done = subprocess.run(
        [sys.executable, "-m", "subic_keras.cli", "train", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "--gamma" in done.stdout and "--bits" in done.stdout


def _options(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                yield from ((f"{name} {n}", a) for n, a in _options(command))
        elif action.option_strings and action.dest != "help":
            yield action.option_strings[0], action


def test_every_option_says_what_it_does_and_its_default():
    from subic_keras.cli import build_parser

    options = list(_options(build_parser()))
    assert len(options) > 50
    for name, action in options:
        assert action.help, name
        if name == "--version":  # argparse's own, with nothing to default
            continue
        text = action.help.replace("%(default)s", str(action.default))
        assert "default" in text or "required" in text, (name, text)


def _seconds(*command: str) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    return time.perf_counter() - start


def test_help_is_instant_next_to_importing_tensorflow():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import subic_keras.cli, sys; print(sorted("
            "{'tensorflow', 'keras', 'faiss'} & set(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.strip() == "[]"
    tensorflow = _seconds(sys.executable, "-c", "import tensorflow")
    helps = [
        _seconds(sys.executable, "-m", "subic_keras.cli", *command, "--help")
        for command in ([], ["search"], ["train"])
    ]
    assert max(helps) <= 0.15 * tensorflow, (helps, tensorflow)


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits")
    assert (
        main(
            [
                "train",
                "--pretrain-epochs",
                "2",
                "--epochs",
                "2",
                "--bits",
                "16",
                "--block-size",
                "16",
                "--output-dir",
                str(out),
            ]
        )
        == 0
    )
    return str(out / "best.keras")


def _by_query(out: str) -> list[dict]:
    """`subic search --json`'s lines (one per match) grouped by query, in order."""
    groups: dict[str, dict] = {}
    for line in out.strip().splitlines():
        match = json.loads(line)
        group = groups.setdefault(match["query"], {"ids": [], "scores": []})
        assert match["rank"] == len(group["ids"]) + 1
        group["ids"].append(match["id"])
        group["scores"].append(match["score"])
    return list(groups.values())


def test_index_build_search_and_evaluate(digits_model, tmp_path, capsys):
    import numpy as np

    from subic_keras.data.datasets import load_images
    from subic_keras.search import SubicIndex

    index_path = str(tmp_path / "db.subic")
    args = ["index", "build", digits_model, "--dataset", "digits", "--split", "train"]
    assert main([*args, "--output", index_path]) == 0
    assert len(SubicIndex.load(index_path)) == 1198

    (_, _), (x_test, _) = load_images("digits")
    np.save(tmp_path / "queries.npy", x_test[:2])
    capsys.readouterr()
    assert (
        main(
            [
                "search",
                digits_model,
                index_path,
                str(tmp_path / "queries.npy"),
                "-k",
                "4",
                "--json",
            ]
        )
        == 0
    )
    lines = _by_query(capsys.readouterr().out)
    assert [len(line["ids"]) for line in lines] == [4, 4]
    assert all(line["scores"] == sorted(line["scores"], reverse=True) for line in lines)

    output = tmp_path / "eval.json"
    evaluate = ["evaluate", digits_model, "--dataset", "digits", "--protocol", "random"]
    assert main([*evaluate, "--queries-per-class", "10", "--output", str(output)]) == 0
    result = json.loads(output.read_text())
    assert result["num_queries"] == 100 and result["num_database"] == 499
    assert 0 < result["map"] <= 1 and result["bits"] == 16
    # Without --query, the query saved with the model.
    saved = Subic.from_train_model(keras.saving.load_model(digits_model))
    assert result["query"] == saved.default_query

    class_query = tmp_path / "eval_class.json"
    evaluate += ["--queries-per-class", "10", "--query", "class_posterior"]
    assert main([*evaluate, "--output", str(class_query)]) == 0
    result = json.loads(class_query.read_text())
    assert result["query"] == "class_posterior" and 0 < result["map"] <= 1
    capsys.readouterr()
    search = ["search", digits_model, index_path, str(tmp_path / "queries.npy")]
    search.append("--json")
    assert main([*search, "-k", "3", "--query", "class_posterior"]) == 0
    lines = _by_query(capsys.readouterr().out)
    assert [len(line["ids"]) for line in lines] == [3, 3]
    # A -k far beyond the index prints what it holds, without allocating for k.
    size = len(SubicIndex.load(index_path))
    assert main([*search, "-k", str(10**12)]) == 0
    lines = _by_query(capsys.readouterr().out)
    assert [len(line["ids"]) for line in lines] == [size, size]
    with pytest.raises(SystemExit):
        main([*search, "-k", "0"])
    assert "-k must be >= 1, received 0" in capsys.readouterr().err


def test_commands_default_to_the_models_own_data(digits_model, tmp_path, capsys):
    from subic_keras.search import SubicIndex

    # `subic train --dataset digits` recorded its data: no dataset flag needed.
    index_path = str(tmp_path / "own.subic")
    assert main(["index", "build", digits_model, "--output", index_path]) == 0
    assert len(SubicIndex.load(index_path)) == 599  # the digits test split
    capsys.readouterr()
    assert main(["evaluate", digits_model]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    # 59 pictures in the smallest test class: random queries, a fifth of it.
    assert line.startswith("digits test, protocol 'random' (queries per class 11")
    with pytest.raises(SystemExit):
        main(["evaluate", digits_model, "--protocol", "paper"])
    assert "use --protocol random" in capsys.readouterr().err


@pytest.mark.slow
def test_milvus_collection_from_the_command_line(digits_model, tmp_path, capsys):
    """A Milvus URI as the index of index build, search and evaluate, against
    the same commands on a `.subic` file."""
    pytest.importorskip("pymilvus", reason="the [milvus] extra")
    import numpy as np

    from subic_keras.data.datasets import load_images

    def subic(*arguments):
        capsys.readouterr()
        try:
            code = main([*map(str, arguments)])
        except SystemExit as stop:
            code = stop.code
        done = capsys.readouterr()
        return code, done.out, done.err

    uri = tmp_path / "codes.db"
    collection = ["--collection", "digits"]
    build = ["index", "build", digits_model, "--dataset", "digits", "--split", "test"]
    code, out, err = subic(*build, "--protocol", "dsh", "--output", uri, *collection)
    assert code == 0 and "to collection 'digits'" in out, err
    assert (
        main([*build, "--protocol", "dsh", "--output", str(tmp_path / "db.subic")]) == 0
    )
    (_, _), (x_test, _) = load_images("digits")
    np.save(tmp_path / "queries.npy", x_test[:3])
    queries = tmp_path / "queries.npy"
    code, out, err = subic("search", digits_model, uri, queries, *collection, "--json")
    assert code == 0, err
    from_milvus = _by_query(out)
    capsys.readouterr()
    assert main(["search", digits_model, str(tmp_path / "db.subic"), str(queries),
                 "--json"]) == 0  # fmt: skip
    from_file = _by_query(capsys.readouterr().out)
    assert [line["ids"][:5] for line in from_milvus] == [
        line["ids"][:5] for line in from_file
    ]
    # The class-posterior query has negative entries, which Milvus's sparse
    # vectors refuse: served by per-block shifts, it finds SubicIndex's items.
    posterior = ["--query", "class_posterior", "--json", "-k", "5"]
    code, out, err = subic(
        "search", digits_model, uri, queries, *collection, *posterior
    )
    assert code == 0, err
    from_milvus = _by_query(out)
    assert main(["search", digits_model, str(tmp_path / "db.subic"), str(queries),
                 *posterior]) == 0  # fmt: skip
    from_file = _by_query(capsys.readouterr().out)
    for got, want in zip(from_milvus, from_file):
        np.testing.assert_allclose(got["scores"], want["scores"], atol=1e-4)
        # Equal scores may come in another order: compare untied ranks.
        untied = [
            i for i, s in enumerate(want["scores"]) if want["scores"].count(s) == 1
        ]
        assert [got["ids"][i] for i in untied] == [want["ids"][i] for i in untied]
    evaluate = ["evaluate", digits_model, "--dataset", "digits", "--protocol", "dsh"]
    milvus = ["--index", uri, *collection]
    code, out, err = subic(*evaluate, *milvus, "--output", tmp_path / "m.json")
    assert code == 0, err
    index = ["--index", tmp_path / "db.subic", "--output", tmp_path / "f.json"]
    assert main([*map(str, evaluate), *map(str, index)]) == 0
    from_milvus, from_file = (
        json.loads((tmp_path / name).read_text()) for name in ("m.json", "f.json")
    )
    assert from_milvus["map"] == from_file["map"]
    code, out, err = subic("search", digits_model, uri, queries, "--collection", "x")
    assert code == 2 and "'x'" in err and "Traceback" not in err, err


@pytest.mark.slow
def test_commands_print_no_tensorflow_log_lines(digits_model, tmp_path):
    from subic_keras.data.datasets import load_images

    (_, _), (x_test, _) = load_images("digits")
    np.save(tmp_path / "queries.npy", x_test[:3])
    index = str(tmp_path / "db.subic")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}
    # Built here: `search` loads the model and runs it as `index build` does.
    build = ["index", "build", digits_model, "--dataset", "digits", "--output", index]
    assert main(build) == 0
    for command in (
        ["export", digits_model, "--output-dir", str(tmp_path / "out"), "--int8",
         "--litert", "--representative-data", "digits"],
        ["search", digits_model, index, str(tmp_path / "queries.npy"), "-k", "2"],
    ):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "subic_keras.cli", *command],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert done.returncode == 0 and done.stderr == "", done.stderr
    assert len(done.stdout.strip().splitlines()) == 3 * (1 + 2)  # name, 2 matches
    # --verbose shows them.
    done = subprocess.run(
        [sys.executable, "-m", "subic_keras.cli", *command, "--verbose"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0 and "I0000" in done.stderr


def test_retrieval_commands_bad_input(digits_model, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["search", str(tmp_path / "missing.keras"), "x.subic", "q.npy"])
    assert "model file not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["search", digits_model, str(tmp_path / "none.subic"), "q.npy"])
    assert "none.subic" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["evaluate", digits_model, "--dataset", "digits", "--protocol", "paper"])
    assert "use --protocol random" in capsys.readouterr().err
    index = str(tmp_path / "db.subic")
    assert main(["index", "build", digits_model, "--output", index]) == 0
    np.save(tmp_path / "pixels.npy", np.full((2, 8, 8), 200.0))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["search", digits_model, index, str(tmp_path / "pixels.npy")])
    assert "must hold pixels in [0, 1]" in capsys.readouterr().err


def test_evaluate_reports_expected_ap_over_tie_orders(digits_model):
    from subic_keras.data.datasets import load_images
    from subic_keras.evaluation import retrieval_metrics as evaluation
    from subic_keras.serving import retrieval

    subic = _load_model(digits_model)
    (_, _), (images, labels) = load_images("digits")
    result = retrieval.evaluate(subic, images, labels, "random", queries_per_class=5)
    assert result["map"] <= result["map_expected"] + 1e-12
    assert 1 <= result["distinct_database_codes"] <= result["num_database"]
    query_idx, db_idx = evaluation.protocol_split("random", labels, queries_per_class=5)
    scores = evaluation.asymmetric_scores(
        subic.query(retrieval.as_model_inputs(images[query_idx])),
        subic.encode(retrieval.as_model_inputs(images[db_idx])),
        subic.num_blocks,
        subic.block_size,
    )
    expected = evaluation.mean_average_precision(
        scores, labels[query_idx], labels[db_idx], ties="expected"
    )
    assert abs(result["map_expected"] - expected) < 1e-6


def test_evaluate_on_the_classes_a_model_was_trained_without(
    digits_model, tmp_path, capsys
):
    import keras

    with pytest.raises(SystemExit) as stop:
        main(["evaluate", digits_model, "--protocol", "unseen"])
    assert stop.value.code == 2
    assert "was trained on every class" in capsys.readouterr().err
    # As `subic train --exclude-classes 2,4,6` records it.
    model = keras.saving.load_model(digits_model)
    model.data_source = {**model.data_source, "held_out_classes": "2,4,6"}
    model.default_query = "class_posterior"  # as validation may choose
    held = tmp_path / "held.keras"
    model.save(held)
    out = tmp_path / "unseen.json"
    argv = ["evaluate", str(held), "--protocol", "unseen", "--queries-per-class", "10"]
    assert main([*argv, "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "digits test, classes [2, 4, 6] (held out of training), protocol " in printed
    result = json.loads(out.read_text())
    assert result["protocol"] == "unseen" and result["num_queries"] == 30
    assert result["num_database"] < 200  # three classes of the test split
    # The class posterior scores by classes these pictures are not of: the
    # paper's z unless asked, as the other protocols keep the saved query.
    assert result["query"] == "fc0"
    asked = tmp_path / "asked.json"
    argv += ["--query", "class_posterior", "--output", str(asked)]
    assert main(argv) == 0
    assert json.loads(asked.read_text())["query"] == "class_posterior"
    paper = tmp_path / "paper.json"
    assert main(["evaluate", str(held), "--output", str(paper)]) == 0
    assert json.loads(paper.read_text())["query"] == "class_posterior"


def _load_model(path):
    import keras

    from subic_keras import Subic

    return Subic.from_train_model(keras.saving.load_model(path))


@pytest.mark.slow
def test_search_with_huge_k_fits_in_4_gb(digits_model, tmp_path):
    from subic_keras.data.datasets import load_images

    (_, _), (x_test, _) = load_images("digits")
    np.save(tmp_path / "queries.npy", x_test[:2])
    index = str(tmp_path / "db.subic")
    assert (
        main(["index", "build", digits_model, "--dataset", "digits", "--output", index])
        == 0
    )

    command = [
        sys.executable,
        "-m",
        "subic_keras.cli",
        "search",
        digits_model,
        index,
        str(tmp_path / "queries.npy"),
        "-k",
        "1000000000",
        "--json",
    ]
    done = subprocess.run(
        with_memory_limit(command, 4 * 2**30),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = _by_query(done.stdout)
    assert [len(line["ids"]) for line in lines] == [599, 599]


@pytest.mark.slow
def test_a_model_too_large_for_memory_is_one_line(tmp_path):
    budget = ["--pretrain-epochs", "0", "--epochs", "1"]
    command = [
        sys.executable,
        "-m",
        "subic_keras.cli",
        "train",
        "-M",
        "100000",
        "-K",
        "1024",
        *budget,
        "--output-dir",
        str(tmp_path / "run"),
    ]
    done = subprocess.run(
        with_memory_limit(command, 8 << 30),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith("subic train: error: out of memory")


def test_a_query_array_is_bounded_by_its_header_before_it_is_read(tmp_path):
    from numpy.lib import format as npy

    from subic_keras.cli.search_commands import _read_npy

    def claiming(name, shape, body=b""):
        path = tmp_path / name
        with open(path, "wb") as handle:
            npy.write_array_header_1_0(
                handle,
                {"descr": "|u1", "fortran_order": False, "shape": shape},
            )
            handle.write(body)
        return str(path)

    huge = claiming("huge.npy", (100_000, 100_000, 3))  # 30 GB claimed, 128 bytes
    with pytest.raises(ValueError, match=r"query array too large: 30000 MB.*huge"):
        _read_npy(huge, (32, 32, 3))
    cut = claiming("cut.npy", (2, 32, 32, 3), bytes(100))
    with pytest.raises(ValueError, match="truncated .npy array: .* 6,144 bytes"):
        _read_npy(cut, (32, 32, 3))
    whole = claiming("whole.npy", (2, 32, 32, 3), bytes(6144))
    assert _read_npy(whole, (32, 32, 3)).shape == (2, 32, 32, 3)
