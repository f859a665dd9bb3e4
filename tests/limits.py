"""Running a command under a memory limit, from a test process."""

import sys

# The child limits itself, then becomes the command: a `preexec_fn` would
# run between fork and exec in a copy of the test process, whose other
# threads (gRPC's, once a Ray test ran in it) do not survive the fork.
_TRAMPOLINE = (
    "import os, resource, sys; limit = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_AS, (limit, limit)); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)


def with_memory_limit(argv: list[str], limit_bytes: int) -> list[str]:
    """`argv` (its first item an executable's path) run with at most
    `limit_bytes` of address space."""
    return [sys.executable, "-c", _TRAMPOLINE, str(limit_bytes), *argv]
