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
