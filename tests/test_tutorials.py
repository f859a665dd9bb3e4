"""Executes every tutorial notebook top to bottom in QUICK mode.

Each notebook is read, executed in memory with nbclient (the committed file, with its
full-mode outputs, is never written) from the `tutorials/` directory, with
`SUBIC_QUICK=1` (tiny subsets, one or two epochs), `SUBIC_DATA_DIR` pointing at the
offline data and the repository on `PYTHONPATH`. A notebook passes when no cell raises.
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


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_runs_in_quick_mode(path, shared_data_dir, monkeypatch):
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

    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        resources={"metadata": {"path": str(TUTORIALS)}},
    )
    client.execute()  # raises CellExecutionError naming the failing cell

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
