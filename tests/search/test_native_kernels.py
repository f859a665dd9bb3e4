"""The native kernels in C, on their own: each against the portable kernel.

`native/kernels_check.c` builds `_scan.c` without its Python binding and
checks every kernel the CPU runs against the portable one, exactly, on
random codes of every layout with the queries that stress the bounds. It
runs natively, and cross-compiled for aarch64 under qemu-user, which is how
the NEON kernel is checked on an x86 machine (Debian's
`gcc-aarch64-linux-gnu` and `qemu-user`; CI installs them and sets
SUBIC_REQUIRE_NEON=1, so that it fails there rather than skips).
"""

import os
import pathlib
import shutil
import subprocess

import pytest

CHECK = pathlib.Path(__file__).parent / "native" / "kernels_check.c"


@pytest.fixture(autouse=True)
def scanner():
    """One run: these tests name their kernels (overrides the fixture)."""
    return None


def _build_and_run(compiler: str, output: pathlib.Path, *runner: str) -> str:
    subprocess.run(
        [
            compiler,
            "-O2",
            "-std=gnu11",
            "-static",
            "-o",
            str(output),
            str(CHECK),
            "-lm",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    done = subprocess.run(
        [*runner, str(output)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def test_every_kernel_of_this_cpu_equals_portable(tmp_path):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    out = _build_and_run(compiler, tmp_path / "check")
    assert out.rstrip().endswith("equal the portable kernel")


def test_neon_kernel_under_emulation(tmp_path):
    compiler = shutil.which("aarch64-linux-gnu-gcc")
    emulator = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    if compiler is None or emulator is None:
        if os.environ.get("SUBIC_REQUIRE_NEON") == "1":
            pytest.fail("aarch64-linux-gnu-gcc and qemu-aarch64 are required here")
        pytest.skip(
            "needs aarch64-linux-gnu-gcc and qemu-aarch64 (apt: "
            "gcc-aarch64-linux-gnu qemu-user)"
        )
    out = _build_and_run(compiler, tmp_path / "check", emulator)
    neon = [line for line in out.splitlines() if line.startswith("ok neon ")]
    # Every shape, in each of its layouts (nibbles for K = 2, 4, 16), with
    # and without a filter.
    assert len(neon) == 2 * 17, out
    assert sum(line.endswith("filtered=1") for line in neon) == 17, out
