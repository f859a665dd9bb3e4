"""Helpers of the command-line tests."""

import time

import pytest

from subic_keras.cli import main


def one_line_error(capsys, *arguments) -> tuple[str, float]:
    """`subic *arguments`'s error and seconds: status 2, one line, no
    traceback (asserted)."""
    start = time.perf_counter()
    with pytest.raises(SystemExit) as stop:
        main(list(map(str, arguments)))
    seconds = time.perf_counter() - start
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    return err, seconds
