"""Copy rules chosen on a folder's own pictures, with no labels.

The rules an instance code saves (`copies.calibrate`) hold on the pictures
it was validated on. A folder of other pictures gets its own
(`calibrate_folder`): altered copies of a sample of its pictures are
searched among the rest, a result right when its pixels are the original's,
and each rule is the least one as precise as `copies.PRECISION` there
(`copies.choose_rules`). `retrieval.choose_copy_rules` runs it on an index
and records the result in it; `rules_line` says it in one line.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from subic_keras._validation import check_int
from subic_keras.instance.copies import (
    CALIBRATION_K,
    COPY_RULES,
    PRECISION,
    choose_rules,
    copy_margins,
    share_above,
)
from subic_keras.search.base import search_codes_with
from subic_keras.search.subic_index import SubicIndex

# Pictures of a folder `calibrate_folder` decodes and alters at most, and the
# least it chooses rules on (half copies of pictures indexed, half not).
FOLDER_SAMPLE = 2000
FOLDER_LEAST = 10
# The share of a folder's pictures, unaltered, that the copy margin may mark
# with a different one (`DIFFERENT_SHARE` on validation, and for the
# duplicate rule): a folder holds copies of its own pictures (bursts,
# re-saved files) that count as different here, unlabelled; at 1 %, 2.4 %
# of planted copies left the margin marking almost nothing
# (benchmarks/folder_copies.py). Precision on its altered copies still
# bounds what is marked.
FOLDER_DIFFERENT_SHARE = 0.05
# The change of a folder's size past which `index add` chooses its copy rules
# again (`rules_stale`).
RECHOOSE_SHARE = 0.2


def calibrate_folder(
    code,
    codes: np.ndarray,
    fingerprints: np.ndarray,
    decode,
    *,
    sample: int = FOLDER_SAMPLE,
    precision: float = PRECISION,
    seed: int = 0,
    families: Sequence[str] | None = None,
    batch_size: int = 512,
) -> dict:
    """Chooses the copy rules of a folder's index on its own pictures.

    As `calibrate`, with the folder as the validation set and no labels: a
    sample of `sample` pictures drawn at random is decoded and altered by
    `families`; the first half are copies of pictures the index holds, the
    second half of pictures it lacks (they and their exact copies left out
    of the search). A result is correct when its pixels are the original's
    (the same fingerprint). The floors are what the folder's pictures,
    unaltered, reach with a different one. The cost is bounded by `sample`
    (decoded pictures, and searches among `len(codes)`), not the folder.

    Example:

    >>> rules = calibrate_folder(code, codes, fingerprints, decode)  # doctest: +SKIP
    >>> rules["copy_margin"], rules["copy_blocks"], rules["copies"]  # doctest: +SKIP
    (-0.8, 61, 2000)

    Args:
        code: the `InstanceSubic` that wrote `codes`.
        codes: the folder's instance codes `(n, M)`, its pictures in order.
        fingerprints: their pixel fingerprints `(n,)` (0: unknown, never
            equal to another's).
        decode: `decode(positions) -> (pictures, positions)`: the uint8
            pictures at those positions, at `code`'s input, and the
            positions decoded (a file gone since is left out).
        sample: pictures drawn, at most.
        precision: the least share of marked results that are copies.
        seed: the draw's and the alterations' seed.
        families: the alteration families (default: all).
        batch_size: prediction batch size.

    Returns:
        `{"copy_margin", "copy_blocks"}` (None where no rule reaches
        `precision`), `"copies"` (altered copies measured), `"pictures"`
        (the folder's size), `"precision"` (the target), and per rule
        (`"margin"`, `"blocks"`) the precision and recall measured; or, for
        a folder too small to measure, both rules None and `"reason"`.
    """
    from subic_keras.instance import alterations

    codes = np.asarray(codes)
    count = len(codes)
    sample = check_int("sample", sample, minimum=2 * FOLDER_LEAST)
    if not 0 < precision <= 1:
        raise ValueError(f"precision must be in (0, 1], received {precision}")
    rng = np.random.default_rng(seed)
    pictures, drawn = decode(np.sort(rng.permutation(count)[:sample]))
    drawn = np.asarray(drawn, np.int64)
    none: dict = {"copy_margin": None, "copy_blocks": None, "copies": 0}
    none["pictures"] = count
    none.update(precision=precision, num_blocks=code.num_blocks)
    if len(drawn) < 2 * FOLDER_LEAST:
        reason = f"{len(drawn)} pictures, too few to choose a rule on"
        return {**none, "reason": reason}
    # Pictures by their pixels: equal fingerprints are one picture.
    fingerprints = np.asarray(fingerprints, np.uint64)
    _, picture = np.unique(fingerprints, return_inverse=True)
    picture = np.where(fingerprints == 0, -1 - np.arange(count), picture.ravel())
    shuffled = rng.permutation(len(drawn))
    pictures, drawn = pictures[shuffled], drawn[shuffled]
    half = len(drawn) // 2
    keep = ~np.isin(picture, picture[drawn[half:]])
    k = min(CALIBRATION_K, int(keep.sum()))
    if k == 0:
        return {**none, "reason": "every picture is a copy of the others"}
    every = SubicIndex(code.num_blocks, code.block_size)
    every.add(codes, ids=np.arange(count))

    def search(queries, width):
        return every.search_kept(queries, width, keep)

    families = alterations.FAMILIES if families is None else families
    copies = alterations.alter_batch(pictures, seed=seed, families=families)
    queried = code.query(copies, batch_size)
    truth = np.where(np.arange(len(drawn)) < half, picture[drawn], count)[:, None]
    scores, found = search(queried, k)
    scored = (
        copy_margins(queried, scores, code.block_size).ravel(),
        (picture[found] == truth).ravel(),
    )
    own = queried.reshape(len(queried), code.num_blocks, code.block_size).argmax(-1)
    equal, found = search_codes_with(search, own, k, code.block_size, 4096)
    blocks = (
        equal.ravel(),
        (picture[np.maximum(found, 0)] == truth).ravel() & (found.ravel() >= 0),
    )

    floors = _floors(code, every, codes, pictures, picture, drawn, batch_size)
    chosen = choose_rules(scored, blocks, floors, precision)
    result = {**none, "copies": len(drawn)}
    if (
        chosen["copy_margin"]["value"] is None
        and chosen["copy_blocks"]["value"] is None
    ):
        result["reason"] = _why_none(floors, code.num_blocks, precision, len(drawn))
    for name, short in zip(COPY_RULES, ("margin", "blocks")):
        result[name] = chosen[name]["value"]
        result[short] = {
            key: chosen[name].get(key) for key in ("precision", "recall", "floor")
        }
    return result


def _floors(code, every, codes, pictures, picture, drawn, batch_size) -> dict:
    """The least value of each rule, for `calibrate_folder`: `every` holds
    the folder's `codes`, `picture` tells pictures apart by their pixels,
    `pictures` are those `drawn`."""
    # Floors. A code that chose its rules on validation, whose different
    # pictures are known to be different, is bounded by them: the folder's
    # own copies (unlabelled) count as different here, and a folder of 10 %
    # copies left its duplicate rule listing 1 of 20 (its precision on the
    # folder's copies still decides). Else: what the drawn pictures,
    # unaltered, reach with every other picture.
    floors = {name: getattr(code, name, None) for name in COPY_RULES}
    width = min(CALIBRATION_K + 1, len(codes))
    if floors["copy_margin"] is None:
        originals = code.query(pictures, batch_size)
        scores, found = every.search(originals, width)
        other = picture[found] != picture[drawn][:, None]
        best = np.where(other, scores, -np.inf).max(1)
        margins = copy_margins(originals, best[:, None], code.block_size)[:, 0]
        margin = share_above(margins[np.isfinite(margins)], FOLDER_DIFFERENT_SHARE)
        floors["copy_margin"] = np.floor(margin * 1e6 + 1) / 1e6
    if floors["copy_blocks"] is None:
        equal, found = every.search_codes(codes[drawn], width)
        other = picture[found] != picture[drawn][:, None]
        most = np.where(other, equal, -1).max(1)
        # Pairs among stored codes: a duplicate rule's mistakes add up as
        # pairs, so different pictures bound it as on validation.
        floors["copy_blocks"] = share_above(most[most >= 0]) + 1
    return floors


def _why_none(floors: dict, num_blocks: int, precision: float, copies: int) -> str:
    """Why no rule was chosen on a folder: its pictures' codes collide, or
    no threshold was precise enough."""
    if floors["copy_blocks"] > num_blocks and floors["copy_margin"] > 0:
        return (
            f"more than {FOLDER_DIFFERENT_SHARE:.0%} of its pictures share their whole "
            "code with a different one"
        )
    return (
        f"no rule reached {100 * precision:g} % precise on {copies:,} of its own copies"
    )


def rules_stale(record: dict | None, count: int) -> bool:
    """Whether an index of `count` pictures should choose its copy rules
    again: it chose none on its pictures, or its size has changed by more
    than `RECHOOSE_SHARE` since (a folder's rules follow its size: more
    pictures, more that look alike).

    Example:

    >>> rules_stale({"copies": {"pictures": 1000}}, 1100)
    False
    >>> rules_stale({"copies": {"pictures": 1000}}, 1300)
    True
    """
    chosen = (record or {}).get("copies")
    if not isinstance(chosen, dict) or not isinstance(chosen.get("pictures"), int):
        return True
    return abs(count - chosen["pictures"]) > RECHOOSE_SHARE * chosen["pictures"]


def rules_line(rules: dict) -> str:
    """The one line that says which copy rules a folder got, and why.

    Example:

    >>> print(rules_line({"copy_margin": -0.8, "copy_blocks": 61,
    ...     "copies": 200, "precision": 0.99, "num_blocks": 64}))
    copies: margin -0.8, 61 of 64 blocks; 99 % precise on 200 of the folder's own copies
    """
    margin, blocks = rules.get("copy_margin"), rules.get("copy_blocks")
    target = f"{100 * rules.get('precision', PRECISION):g} %"
    if margin is None and blocks is None:
        return f"copies: exact copies only; {rules.get('reason', 'no rule chosen')}"
    measured = f"{rules['copies']:,} of the folder's own copies"
    parts = [
        "no margin" if margin is None else f"margin {margin:g}",
        "no duplicate rule"
        if blocks is None
        else f"{blocks} of {rules['num_blocks']} blocks",
    ]
    return f"copies: {', '.join(parts)}; {target} precise on {measured}"


def copy_recall(
    code,
    pictures: np.ndarray,
    rows: np.ndarray,
    *,
    seed: int = 0,
    batch_size: int = 512,
) -> float:
    """recall@1 of altered copies among a folder's pictures: the share of
    `pictures[rows]`, altered by every family, whose first result among all
    of `pictures`' codes is the original (or a picture of its pixels).

    Example:

    >>> copy_recall(code, pictures, np.arange(100))  # doctest: +SKIP
    0.58

    Args:
        code: an `InstanceSubic`.
        pictures: uint8 pictures `(n, H, W[, C])` at its input.
        rows: the pictures whose copies are searched for.
        seed: the alterations' seed.
        batch_size: prediction batch size.
    """
    from subic_keras.data import images
    from subic_keras.instance import alterations

    rows = np.asarray(rows, np.int64)
    if not len(rows):
        return 0.0
    index = SubicIndex(code.num_blocks, code.block_size)
    index.add(code.encode(pictures, batch_size), ids=np.arange(len(pictures)))
    copies = alterations.alter_batch(pictures[rows], seed=seed)
    _, found = index.search(code.query(copies, batch_size), 1)
    prints = np.array([images.fingerprint(p) for p in pictures], np.uint64)
    return float(np.mean(prints[found[:, 0]] == prints[rows]))
