"""Executes every tutorial notebook top to bottom in QUICK mode, with the
commands of tutorials/README.md.

Notebook 01 runs through the README's `jupyter nbconvert` command, the others
through its nbclient snippet with their name in place of 01's; in both, the
output goes to a temporary file (the committed notebooks keep their full-run
outputs), `SUBIC_QUICK=1` (tiny subsets, one or two epochs), `SUBIC_DATA_DIR`
points at the offline data and the repository is on `PYTHONPATH`. The
README's `pip install` is skipped (the tests run in the installed package)
and its `pytest` command is this file. A notebook passes when no cell raises.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = Path(__file__).resolve().parents[1]
TUTORIALS = REPO / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("[0-9][0-9]_*.ipynb"))
CELL_TIMEOUT = 240  # seconds per cell; a QUICK notebook takes well under a minute


def test_every_notebook_is_listed():
    expected = {
        "01_quickstart.ipynb",
        "02_cifar10_retrieval.ipynb",
        "03_classification_table.ipynb",
        "04_export_and_serve.ipynb",
    }
    assert {path.name for path in NOTEBOOKS} == expected
    readme = (TUTORIALS / "README.md").read_text()
    for name in expected:
        assert name in readme


def _readme_blocks() -> list[tuple[str, str]]:
    import re

    text = (TUTORIALS / "README.md").read_text()
    return re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)


def test_readme_commands_are_what_the_tests_run():
    blocks = _readme_blocks()
    assert [language for language, _ in blocks] == ["bash", "python", "bash"]
    install, snippet, tests = (code for _, code in blocks)
    lines = [line.split("#")[0].strip() for line in install.strip().splitlines()]
    assert lines[0] == 'pip install ".[notebooks]"' and lines[1] == "cd tutorials"
    assert lines[2].startswith("jupyter nbconvert") and "--inplace" not in lines[2]
    assert "NotebookClient" in snippet and '"01_quickstart.ipynb"' in snippet
    assert tests.strip() == "python -m pytest tests/test_tutorials.py"


def _run_readme_command(path: Path, out: Path) -> Path:
    """Notebook 01 by the README's nbconvert line, in a copy of `tutorials/`
    so that its output file lands in `out`."""
    import shlex
    import subprocess
    import sys

    install = _readme_blocks()[0][1]
    line = install.strip().splitlines()[2].split("#")[0]
    words = shlex.split(line)
    assert words[0] == "jupyter"
    command = [sys.executable, "-m", "jupyter", *words[1:], "--output-dir", str(out)]
    command += [f"--ExecutePreprocessor.timeout={CELL_TIMEOUT}"]
    done = subprocess.run(command, cwd=TUTORIALS, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    output = words[words.index("--output") + 1]
    return out / output


def _run_readme_snippet(path: Path, out: Path) -> Path:
    """Any notebook by the README's nbclient snippet, its name in place of 01's."""
    snippet = _readme_blocks()[1][1]
    snippet = snippet.replace('"01_quickstart.ipynb"', repr(path.name), 1)
    target = out / f"{path.stem}.run.ipynb"
    snippet = snippet.replace('"01_quickstart.run.ipynb"', repr(str(target)))
    snippet = snippet.replace("timeout=1800", f"timeout={CELL_TIMEOUT}")
    previous = os.getcwd()
    os.chdir(TUTORIALS)
    try:
        exec(snippet, {})
    finally:
        os.chdir(previous)
    return target


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_runs_in_quick_mode(path, shared_data_dir, monkeypatch, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    first_code = next(cell for cell in notebook.cells if cell.cell_type == "code")
    # The convention every notebook follows: the parameter cell comes first.
    assert "DATA_DIR" in first_code.source and "SUBIC_QUICK" in first_code.source

    # The kernel inherits the environment of this process.
    monkeypatch.setenv("SUBIC_QUICK", "1")
    monkeypatch.setenv("SUBIC_DATA_DIR", str(shared_data_dir))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    path_entries = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path_entries))

    run = _run_readme_command if path.name == "01_quickstart.ipynb" else None
    executed = (run or _run_readme_snippet)(path, tmp_path)
    notebook = nbformat.read(executed, as_version=4)
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert not errors
    unexecuted = [
        cell.source[:60]
        for cell in notebook.cells
        if cell.cell_type == "code" and cell.get("execution_count") is None
    ]
    assert not unexecuted
