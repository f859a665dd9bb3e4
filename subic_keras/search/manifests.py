"""Shard manifests: the small JSON file that lists an index's shards.

A collection larger than one machine is split into shards (`save_shards`),
each a `.subic` file that every node can read (a shared or replicated
folder), listed in order by a *shard manifest*:

    {"format": "subic.shards", "version": 3, "num_blocks": 8,
     "block_size": 64, "build": "3f9a0c1e", "model": "<digest>",
     "shards": ["part-3f9a0c1e-0.subic", "part-3f9a0c1e-1.subic"],
     "previous": ["part-77d2b410-0.subic", "part-77d2b410-1.subic"]}

(names relative to the manifest; version 1 has no `build`, `model` or
`previous`; version 2 has no labelled shards, below). `ray_index.RayIndex`
searches one.

Builds and readers. Every build (`save_shards`, `index build --output
X.shards.json`) writes its shards under names of its own, `<stem>-<build>-
<s>.subic` with `build` a random token, never a name an earlier build used,
and switches the manifest to them atomically, last. So a reader opens one
whole build: the manifest it read names files that are complete and
unchanged by any later build. The build before stays on disk, listed as
`previous`; the one before that is removed. The rule, then: an index
opened from a manifest keeps working across one rebuild; after two, a
shard whose actor restarts finds its file gone and says so (the index is
degraded and must be opened again); it never loads another build's file.
Only one build at a time may write a manifest: a build removes the files
of builds that are neither its own nor its manifest's current or previous
one.

`model` is the digest of the model that wrote the codes (null for codes
without one): a shard's actor checks it on every start, so a file replaced
by codes of another model is refused, naming it, even after a restart.
From version 3 each shard file also records which shard of which build it
is (`SubicIndex.shard_label`, kept through the actor's own writes), checked on
every start as well (`check_label`): a copy of another shard, whose ids
would be listed twice, or a file of another build put in a shard's place
is refused, not served.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import secrets

from subic_keras._io import atomic_path
from subic_keras._validation import check_int, load_json
from subic_keras.data.paths import is_utf8, open_in_folder, read_bytes, relative_parts
from subic_keras.search import file_format
from subic_keras.search.checks import BUILD as _BUILD
from subic_keras.search.subic_index import SubicIndex

MANIFEST_FORMAT = "subic.shards"
MANIFEST_VERSION = 3
MANIFEST_SUFFIX = ".shards.json"
MAX_SHARDS = 4096
_MAX_MANIFEST_BYTES = 1 << 20
# The tokens `new_build` makes: 4 random bytes in hexadecimal.
_NEW_BUILD = r"[0-9a-f]{8}"


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A shard manifest: the block shape, the manifest's real folder and
    the shards' paths in it; from version 2, the build's token, the digest
    of the model that wrote the codes (`records_model`) and the names of
    the previous build's shards; from version 3, that every shard file is
    labelled as its shard of the build (`labelled`, `check_label`)."""

    num_blocks: int
    block_size: int
    shards: tuple[str, ...]
    folder: str
    build: str | None = None
    model: str | None = None
    records_model: bool = False
    previous: tuple[str, ...] = ()
    labelled: bool = False


def is_manifest(uri) -> bool:
    """Whether `uri` names a shard manifest (by its suffix)."""
    return isinstance(uri, (str, os.PathLike)) and os.fspath(uri).endswith(
        MANIFEST_SUFFIX
    )


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Reads and checks a shard manifest.

    Read as every file is (`paths.read_bytes`: a regular file of at most
    1 MiB, a FIFO refused at once). Its shards are `.subic` files named
    relative to its folder, inside it: no absolute path, no `..`, no
    manifest (so no manifest can list itself or another), each once. What
    the names lead to on disk is `check_shard_files`'.

    Raises:
        ValueError: naming the path, for a file that is not a manifest, or
            shard names that break those rules.
        OSError: the manifest cannot be read, or is not a regular file.
    """
    path = os.fspath(path)

    def fail(reason: str) -> ValueError:
        return ValueError(f"{path!r} is not a valid shard manifest: {reason}")

    data = read_bytes(path, _MAX_MANIFEST_BYTES, "shard manifest")
    try:
        manifest = load_json(data)
    except ValueError as error:
        raise fail(f"not JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise fail(f'its "format" is not {MANIFEST_FORMAT!r}')
    version = manifest.get("version")
    if version not in (1, 2, 3) or isinstance(version, bool):
        raise fail(f"version {version!r}, this code reads 1 to 3")
    num_blocks, block_size = manifest.get("num_blocks"), manifest.get("block_size")
    if not all(isinstance(v, int) and v >= 1 for v in (num_blocks, block_size)):
        raise fail(
            f"num_blocks and block_size ({num_blocks!r}, {block_size!r}) are not "
            "positive integers"
        )
    assert isinstance(num_blocks, int) and isinstance(block_size, int)
    shards = manifest.get("shards")
    if (
        not isinstance(shards, list)
        or not 1 <= len(shards) <= MAX_SHARDS
        or not all(isinstance(s, str) and s for s in shards)
    ):
        raise fail(f"shards must be a list of 1 to {MAX_SHARDS} file names")
    folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    paths = []
    for shard in shards:
        name = shard[:200]
        if "\0" in shard or not is_utf8(shard):
            raise fail(f"shard {name!r} is not a file name")
        try:
            parts = relative_parts(shard)  # the rule `open_in_folder` applies
        except PermissionError:
            raise fail(f"shard {name!r} lies outside the manifest's folder") from None
        if not shard.endswith(".subic"):
            raise fail(
                f"shard {name!r} is not a .subic index file: a manifest lists "
                "index files only, never a manifest"
            )
        paths.append(os.path.join(folder, *parts))
    if len(set(paths)) != len(paths):
        raise fail("a shard is listed twice")
    if version == 1:
        return Manifest(num_blocks, block_size, tuple(paths), folder)
    build, model = manifest.get("build"), manifest.get("model")
    previous = manifest.get("previous", [])
    if not isinstance(build, str) or not _BUILD.fullmatch(build):
        raise fail(f"build {str(build)[:40]!r} is not 8 to 32 hexadecimal digits")
    if model is not None and not (isinstance(model, str) and 0 < len(model) <= 200):
        raise fail(f"model {str(model)[:40]!r} is not a model's digest or null")
    if not isinstance(previous, list) or not all(
        isinstance(n, str) and _plain_name(n) for n in previous
    ):
        raise fail("previous must be a list of .subic file names in its folder")
    return Manifest(
        num_blocks,
        block_size,
        tuple(paths),
        folder,
        build=build,
        model=model,
        records_model=True,
        previous=tuple(previous[:MAX_SHARDS]),
        labelled=version >= 3,
    )


def check_label(manifest: Manifest, number: int, label) -> None:
    """Refuses a file in the place of shard `number` of `manifest` that is
    not that shard of its build (`SubicIndex.shard_label`): a copy of another
    shard (its ids repeated), or of another build. Checked where the
    manifest says its shards are labelled (version 3: the builds of
    `save_shards` and `index build`); a shard's actor checks it on every
    start."""
    if not manifest.labelled or label == (manifest.build, number):
        return
    found = (
        "records no shard"
        if label is None
        else f"is shard {label[1]} of build {label[0]}"
    )
    raise ValueError(
        f"its file {found}, not shard {number} of its manifest's build "
        f"{manifest.build}: the file was replaced; build the index again"
    )


def check_shard_files(manifest: Manifest, path: str | os.PathLike) -> None:
    """Checks, before any actor starts, that every shard of `manifest` (read
    from `path`) is a regular index file inside its folder: each opened as
    its actor opens it (`paths.open_in_folder`: a link out refused on the
    opened descriptor) and its first bytes read.

    Raises:
        FileNotFoundError: shards missing, naming up to five.
        ValueError: a shard that leads out of the folder, is not a regular
            file, or is not an index file, naming it.
    """
    missing = []
    for shard in manifest.shards:
        relative = os.path.relpath(shard, manifest.folder)
        try:
            with open(open_in_folder(manifest.folder, relative), "rb") as handle:
                magic = handle.read(len(file_format.MAGIC))
        except FileNotFoundError:
            missing.append(shard)
            continue
        except OSError as error:
            reason = "leads out of the manifest's folder"
            if not isinstance(error, PermissionError):
                reason = error.strerror or str(error)
            raise ValueError(
                f"shard {relative[:200]!r} of {os.fspath(path)!r}: {reason}"
            ) from None
        if magic != file_format.MAGIC:
            raise ValueError(
                f"shard {relative[:200]!r} of {os.fspath(path)!r} is not a "
                "SuBiC index file"
            )
    if missing:
        raise FileNotFoundError(
            errno.ENOENT,
            f"{len(missing)} shard files not found: {', '.join(missing[:5])}",
            os.fspath(path),
        )


def save_shards(
    index: SubicIndex, path: str | os.PathLike, num_shards: int
) -> list[str]:
    """Splits `index` into `num_shards` files beside a manifest at `path`.

    Shard `s` is `<path without .shards.json>-<build>-<s>.subic`, a
    contiguous run of the items (`SubicIndex.shard`), so the manifest's
    order is the insertion order. Every file is written atomically, the
    manifest last; the files of the build before stay, those of the one
    before it are removed (module doc: a reader keeps working across one
    rebuild).

    Example:

    >>> index = SubicIndex(4, 16)
    >>> ids = index.add(np.random.default_rng(0).integers(0, 16, (100, 4)))
    >>> files = save_shards(index, "codes.shards.json", 2)
    >>> len(files), read_manifest("codes.shards.json").shards == tuple(
    ...     os.path.realpath(f) for f in files)
    (2, True)

    Returns:
        The shard files' paths.

    Raises:
        ValueError: for a path without the `.shards.json` suffix.
    """
    path = os.fspath(path)
    if not path.endswith(MANIFEST_SUFFIX):
        raise ValueError(
            f"path must end in {MANIFEST_SUFFIX!r} (a shard manifest), received "
            f"{path!r}"
        )
    num_shards = check_int("num_shards", num_shards, minimum=1)
    if num_shards > MAX_SHARDS:
        raise ValueError(f"num_shards must be <= {MAX_SHARDS}, received {num_shards}")
    build = new_build(path)
    files = shard_paths(path, num_shards, build)
    for number, (file, shard) in enumerate(zip(files, index.shard(num_shards))):
        shard.model, shard.shard_label = index.model, (build, number)
        shard.save(file)
    digest = None if index.model is None else index.model.get("digest")
    write_manifest(
        path, index.num_blocks, index.block_size, files, build, digest, labelled=True
    )
    return files


def new_build(manifest: str | os.PathLike) -> str:
    """A build token no shard file beside `manifest` has."""
    folder = os.path.dirname(os.path.abspath(manifest))
    taken = {match[1] for match in map(_build_of(manifest), _names(folder)) if match}
    while (build := secrets.token_hex(4)) in taken:
        pass
    return build


def is_new_build(token: object) -> bool:
    """Whether `token` is a build token as `new_build` makes them."""
    return isinstance(token, str) and re.fullmatch(_NEW_BUILD, token) is not None


def shard_paths(manifest: str | os.PathLike, num_shards: int, build: str) -> list[str]:
    """The files of build `build` of `num_shards` shards for `manifest`:
    `<stem>-<build>-<s>.subic`."""
    stem = os.fspath(manifest)[: -len(MANIFEST_SUFFIX)]
    return [f"{stem}-{build}-{number}.subic" for number in range(num_shards)]


def write_manifest(
    path: str | os.PathLike,
    num_blocks: int,
    block_size: int,
    files: list[str],
    build: str,
    model: str | None,
    labelled: bool = False,
) -> None:
    """Writes a shard manifest (atomically) listing `files`, in order, and
    the earlier manifest's shards as `previous`; then removes the shard
    files of other builds (module doc). Only files named as a build names
    them (or as versions before 2 did, `<stem>-<s>[.b].subic`) and listed
    by no manifest kept are removed: a manifest written by hand may list
    files that are not ours. `labelled`: each file is labelled as its
    shard of `build` (`SubicIndex.shard_label`), and the manifest (version 3)
    says so, so that a file put in a shard's place is refused
    (`check_label`); else version 2."""
    folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    try:
        earlier: Manifest | None = read_manifest(path)
    except (OSError, ValueError):
        earlier = None
    names = [os.path.basename(f) for f in files]
    previous = []
    if earlier is not None:
        previous = [
            os.path.basename(shard)
            for shard in earlier.shards
            if os.path.dirname(shard) == folder and os.path.basename(shard) not in names
        ]
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION if labelled else 2,
        "num_blocks": num_blocks,
        "block_size": block_size,
        "build": build,
        "model": model,
        "shards": names,
        "previous": previous,
    }
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1)
    keep = {*names, *previous}
    builds = {build} if earlier is None else {build, earlier.build}
    doomed = {n for n in (earlier.previous if earlier else ()) if _ours(path, n)}
    # Files of builds no manifest names: an interrupted `save_shards`.
    doomed |= {
        name
        for name in _names(folder)
        if (match := _build_of(path)(name)) and match[1] not in builds
    }
    for name in doomed - keep:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(folder, name))


def _names(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _stem(manifest: str | os.PathLike) -> str:
    return re.escape(os.path.basename(os.fspath(manifest))[: -len(MANIFEST_SUFFIX)])


def _build_of(manifest: str | os.PathLike):
    """A matcher of the shard file names of a build of `manifest`."""
    pattern = re.compile(_stem(manifest) + rf"-({_NEW_BUILD})-(0|[1-9][0-9]*)\.subic")
    return pattern.fullmatch


def _ours(manifest: str | os.PathLike, name: str) -> bool:
    """Whether `name` is a shard file name a build of `manifest` writes, or
    wrote before manifests had builds."""
    legacy = _stem(manifest) + r"-(0|[1-9][0-9]*)(\.b)?\.subic"
    return bool(_build_of(manifest)(name) or re.fullmatch(legacy, name))


def _plain_name(name: str) -> bool:
    return (
        0 < len(name) <= 255
        and name.endswith(".subic")
        and "/" not in name
        and "\0" not in name
        and name not in (".", "..")
        and is_utf8(name)
    )
