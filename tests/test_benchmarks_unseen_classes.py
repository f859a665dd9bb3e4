"""`python -m benchmarks.unseen_classes`: its arguments (the runs themselves
train for an hour and live in `benchmarks/`)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "size, message",
    [
        ("1", "--block-size must be >= 2, received 1"),
        ("12", "--block-size must be a power of two, received 12"),
    ],
)
def test_a_block_size_that_is_not_a_power_of_two_is_one_line(
    load_benchmark, capsys, size, message
):
    bench = load_benchmark("unseen_classes")
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--data-dir", "data", "--block-size", size])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert (
        bench.parse_args(["--data-dir", "data", "--block-size", "16"]).block_size == 16
    )


def test_the_settings_record_the_epochs_trained_with(load_benchmark):
    bench = load_benchmark("unseen_classes")
    summary = load_benchmark("summary")
    from subic_keras.config import TrainConfig

    defaults = bench.parse_args(["--data-dir", "data"])
    settings = {
        "pretrain_epochs": bench._effective(defaults, "pretrain_epochs"),
        "epochs": bench._effective(defaults, "epochs"),
        "budget": "subic train's defaults",
    }
    assert (settings["pretrain_epochs"], settings["epochs"]) == (
        TrainConfig.pretrain_epochs,
        TrainConfig.epochs,
    )
    counts = f"({TrainConfig.pretrain_epochs} pre-training + {TrainConfig.epochs} "
    assert summary._unseen_budget(settings) == (
        f"`subic train`'s defaults {counts}SuBiC epochs)"
    )
    reduced = bench.parse_args(["--data-dir", "data", "--epochs", "3"])
    assert bench._effective(reduced, "epochs") == 3
    # A file written before the values were recorded.
    older = {
        "pretrain_epochs": None,
        "epochs": None,
        "budget": "subic train's defaults",
    }
    assert summary._unseen_budget(older) == "`subic train`'s defaults"
