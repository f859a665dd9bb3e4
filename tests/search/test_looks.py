"""Tests for subic_keras.search.looks: ties and near copies ordered by look."""

import numpy as np
import pytest

from subic_keras.search import SubicIndex, looks, native
from subic_keras.search.image_index import ImageIndex
from subic_keras.search.uri import open as load_index


def _pictures(rng, n, side=32):
    return rng.integers(0, 256, (n, side, side, 3), np.uint8)


def _reference(queries, query_looks, codes, item_looks, k, keep=None):
    """The refined ranking of the module docstring, from a float64 brute
    force: `(scores, positions)` per query."""
    m, block = codes.shape[1], queries.shape[1] // codes.shape[1]
    offsets = np.arange(m) * block
    kept = np.arange(len(codes)) if keep is None else np.flatnonzero(keep)
    out = []
    for query, query_look in zip(queries.astype(np.float64), query_looks):
        scores = query[codes[kept] + offsets].sum(axis=1)
        ranked = kept[np.lexsort((kept, -scores))]
        ranked_scores = np.sort(scores)[::-1]
        wide = min(len(kept), max(k, looks.SHORTLIST))
        last = ranked_scores[wide - 1]
        candidates = list(ranked[:wide])
        # The tie group reaching the top k, whole when it goes on beyond
        # the shortlist.
        if wide < len(kept) and ranked_scores[k - 1] == last:
            tied_codes = codes[ranked[:wide][ranked_scores[:wide] == last]]
            for position in ranked[wide:]:
                if (codes[position] == tied_codes).all(axis=1).any():
                    candidates.append(position)
        candidates = np.array(candidates)
        by_position = dict(zip(ranked, np.sort(scores)[::-1]))
        cand_scores = np.array([by_position[p] for p in candidates])
        likeness = looks.similarity(query_look[None], item_looks[candidates])[0]
        threshold = cand_scores[min(looks.SHORTLIST, len(candidates)) - 1]
        eligible = cand_scores >= threshold
        near = (likeness >= looks.NEAR_COPY) & eligible
        if looks.STANDOUT <= 1:  # the one that stands out
            alike = np.sort(likeness[eligible])[::-1]
            if (
                len(alike) > 1
                and alike[0] >= looks.STANDOUT_FLOOR
                and alike[0] - alike[1] >= looks.STANDOUT
            ):
                near |= eligible & (likeness == alike[0])
        key = sorted(
            range(len(candidates)),
            key=lambda i: (
                not near[i],
                -likeness[i] if near[i] else -cand_scores[i],
                -likeness[i],
                candidates[i],
            ),
        )[:k]
        out.append((cand_scores[key], candidates[key]))
    return out


def _smooth(rng, n, side=32):
    """Pictures with shapes larger than a pixel, as photographs have."""
    from PIL import Image

    coarse = rng.integers(0, 256, (n, 6, 6, 3), np.uint8)
    bicubic = Image.Resampling.BICUBIC
    return np.stack(
        [np.asarray(Image.fromarray(c).resize((side, side), bicubic)) for c in coarse]
    )


def test_a_look_is_the_centre_and_bounded(rng):
    pictures = _pictures(rng, 5)
    these = looks.look(pictures)
    assert these.shape == (5, looks.LOOK_SIZE) and these.dtype == np.int8
    assert np.abs(these).max() == 127
    grey = looks.look(pictures[..., 0])
    assert np.array_equal(grey, looks.look(np.repeat(pictures[..., :1], 3, -1)))
    assert np.allclose(np.diag(looks.similarity(these, these)), 1.0, atol=1e-6)
    # Only the centre counts: a new border leaves the look as it was.
    framed = pictures.copy()
    framed[:, :4], framed[:, -4:], framed[:, :, :4], framed[:, :, -4:] = 0, 9, 50, 7
    likeness = np.diag(looks.similarity(these, looks.look(framed)))
    assert np.allclose(likeness, 1, atol=1e-3)
    # Any size: a picture and its double-size copy look alike.
    double = pictures.repeat(2, axis=1).repeat(2, axis=2)
    likeness = np.diag(looks.similarity(these, looks.look(double)))
    assert np.allclose(likeness, 1, atol=1e-3)
    # A large picture is read a block of rows at a time: no float copy of it.
    import tracemalloc

    large = np.repeat(pictures[:1], 100, axis=1).repeat(60, axis=2)  # 3200 x 1920
    tracemalloc.start()
    try:
        views = looks.query_look(large)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 48 * 2**20, peak  # the picture as float32 alone: 70 MB
    assert np.diag(looks.similarity(views, these[:1]))[0] > 0.99
    flat = looks.look(np.full((1, 8, 8, 3), 100, np.uint8))  # no variation at all
    assert not flat.any()
    with pytest.raises(ValueError, match=r"pictures must be uint8.*float32"):
        looks.look(pictures.astype(np.float32))
    with pytest.raises(ValueError, match=r"received uint8 \(5, 32, 32, 2\)"):
        looks.look(pictures[..., :2])
    with pytest.raises(ValueError, match=r"received uint8 \(1, 0, 4, 3\)"):
        looks.query_look(np.zeros((1, 0, 4, 3), np.uint8))


def test_a_query_is_seen_as_a_crop_or_a_mirror_image_of_its_original(rng):
    from PIL import Image

    pictures = _smooth(rng, 40)
    items = looks.look(pictures)
    views = looks.query_look(pictures)
    assert views.shape == (40, looks.VIEWS, looks.LOOK_SIZE) and views.dtype == np.int8
    # The first view is the item's own look; the mirrored picture's views
    # hold it too.
    assert np.array_equal(views[:, 0], items)
    mirrored = looks.similarity(looks.query_look(pictures[:, :, ::-1]), items)
    assert np.allclose(np.diag(mirrored), 1, atol=1e-3)
    # Crops keeping 64-90 % of the area, resized back: the original is the
    # most alike picture, found by a view and not by the query's own look.
    crops = []
    for i, picture in enumerate(pictures):
        side = round(32 * np.sqrt(0.64 + 0.26 * i / 39))
        top, left = rng.integers(0, 33 - side, 2)
        crop = Image.fromarray(picture).crop((left, top, left + side, top + side))
        crops.append(np.asarray(crop.resize((32, 32), Image.Resampling.BILINEAR)))
    crop_views = looks.query_look(np.stack(crops))
    by_views = looks.similarity(crop_views, items)
    by_own_look = looks.similarity(crop_views[:, 0], items)
    assert (by_views.argmax(axis=1) == np.arange(40)).all()
    assert np.diag(by_views).min() > 0.9
    assert (np.diag(by_views) > np.diag(by_own_look)).mean() > 0.9


@pytest.mark.parametrize("filtered", [False, True])
@pytest.mark.parametrize("k", [1, 7, 150])
def test_refined_search_equals_the_reference(rng, k, filtered):
    # Few distinct codes: tie groups of dozens, as trained codes give.
    n, m, block = 600, 4, 16
    codes = rng.integers(0, 3, (n, m))
    pictures = _pictures(rng, n)
    item_looks = looks.look(pictures)
    index = SubicIndex(m, block, looks=True)
    index.add(codes, looks=item_looks)
    queries = rng.random((5, m * block)).astype(np.float32)
    # Queries that look like items 10, 20 and 30: near copies of them.
    query_looks = looks.query_look(pictures[[10, 20, 30, 40, 50]])
    query_looks[3:] = looks.query_look(_pictures(rng, 2))
    keep = np.arange(n) % 3 != 0 if filtered else None
    where = np.flatnonzero(keep) if filtered else None
    with looks.settings(shortlist=60):  # tie groups go on beyond it
        scores, ids = index.search(queries, k, looks=query_looks, where=where)
        reference = _reference(queries, query_looks, codes, item_looks, k, keep)
    for row, (expected_scores, expected_ids) in enumerate(reference):
        assert ids[row].tolist() == expected_ids.tolist()
        np.testing.assert_allclose(scores[row], expected_scores, rtol=1e-5)
    # Without looks: the codes' order, ties by position.
    assert index.search(queries, k, where=where)[1].tolist() != ids.tolist()


def test_a_filter_that_keeps_nothing_refines_nothing(rng):
    index = SubicIndex(2, 4, looks=True)
    index.add(rng.integers(0, 4, (10, 2)), looks=looks.look(_pictures(rng, 10)))
    scores, ids = index.search(
        np.ones((3, 8), np.float32), 5, where=[], looks=looks.look(_pictures(rng, 3))
    )
    assert scores.shape == ids.shape == (3, 0)


def test_ties_are_ordered_by_look_and_near_copies_come_first(rng):
    base = _pictures(rng, 1)[0].astype(np.int16)
    noise = rng.integers(-60, 60, (6, 32, 32, 3))
    # Pictures ever further from `base`; with equal codes they tie.
    pictures = np.clip(base + noise * np.arange(6)[:, None, None, None], 0, 255)
    pictures = pictures.astype(np.uint8)[::-1]  # the closest is added last
    index = SubicIndex(2, 4, looks=True)
    index.add(np.zeros((6, 2), int), looks=looks.look(pictures))
    # The query's own look, with a lower score.
    index.add([[1, 1]], looks=looks.look(pictures[-1:]))
    query = np.array([[1.0, 0, 0, 0, 1.0, 0, 0, 0]], np.float32)  # code [0, 0]: 2
    query_look = looks.look(base.astype(np.uint8)[None])
    likeness = looks.similarity(query_look, looks.look(pictures))[0]
    assert np.all(np.diff(likeness) > 0) and likeness[-1] == pytest.approx(1.0)
    assert likeness[0] < looks.NEAR_COPY
    scores, ids = index.search(query, 7, looks=query_look)
    # Near copies of the query first (item 6 too, despite its lower code
    # score), most alike first; then the tie group, most alike first.
    near = [i for i in (5, 4, 3, 2, 1) if likeness[i] >= looks.NEAR_COPY]
    rest = [i for i in (5, 4, 3, 2, 1, 0) if i not in near]
    assert ids[0].tolist() == [5, 6, *near[1:], *rest]
    with looks.settings(near_copy=2.0):  # ties only: the codes' order kept
        scores, ids = index.search(query, 7, looks=query_look)
    assert ids[0].tolist() == [5, 4, 3, 2, 1, 0, 6]
    assert scores[0].tolist() == [2.0] * 6 + [0.0]
    assert looks.NEAR_COPY == 0.95  # restored


@pytest.mark.parametrize("standout", [0.1, 2.0])
def test_the_reference_holds_with_and_without_the_standout_rule(rng, standout):
    n = 400
    codes = rng.integers(0, 3, (n, 3))
    pictures = _pictures(rng, n)
    # Query looks: a picture's, blurred towards noise, so that its original
    # is alike but not a near copy, and stands out.
    noisy = np.clip(
        pictures[:6].astype(int) + rng.integers(-110, 110, (6, 32, 32, 3)), 0, 255
    ).astype(np.uint8)
    item_looks, query_looks = looks.look(pictures), looks.look(noisy)
    index = SubicIndex(3, 4, looks=True)
    index.add(codes, looks=item_looks)
    # Whole numbers: float32 sums (faiss's) are exact, as the reference's.
    queries = rng.integers(0, 8, (6, 12)).astype(np.float32)
    with looks.settings(standout=standout):  # every item a candidate
        scores, ids = index.search(queries, 20, looks=query_looks)
        reference = _reference(queries, query_looks, codes, item_looks, 20)
    for row, (expected_scores, expected_ids) in enumerate(reference):
        assert ids[row].tolist() == expected_ids.tolist()
        np.testing.assert_allclose(scores[row], expected_scores, rtol=1e-5)
    if standout <= 1:  # the originals stand out from random pictures
        likeness = looks.similarity(query_looks, item_looks)
        alike = np.sort(likeness, axis=1)[:, ::-1]
        assert (alike[:, 0] < looks.NEAR_COPY).any()
        shown = (alike[:, 0] - alike[:, 1] >= standout) & (alike[:, 0] >= 0.6)
        assert shown.any()


def test_the_last_tie_group_is_taken_whole_beyond_the_shortlist(rng):
    # 300 items share the best code: the best look among them is found
    # beyond a shortlist of 100.
    pictures = _pictures(rng, 301)
    index = SubicIndex(1, 4, looks=True)
    index.add(np.zeros((300, 1), int), looks=looks.look(pictures[:300]))
    index.add([[1]], looks=looks.look(pictures[300:]))
    query = np.array([[1.0, 0.5, 0, 0]], np.float32)
    with looks.settings(shortlist=100):
        _, ids = index.search(query, 1, looks=looks.look(pictures[250:251]))
    assert ids.tolist() == [[250]]
    _, ids = index.search(query, 1)
    assert ids.tolist() == [[0]]


def test_codes_longer_than_eight_bytes_group_exactly(rng):
    # 16 blocks of 256: 16-byte codes, grouped by their first 8 bytes and
    # then compared whole.
    codes = np.zeros((50, 16), int)
    codes[25:, 15] = 1  # the same first 8 bytes, another code
    pictures = _pictures(rng, 50)
    index = SubicIndex(16, 256, looks=True)
    index.add(codes, looks=looks.look(pictures))
    query = np.zeros((1, 16 * 256), np.float32)
    query[0, np.arange(16) * 256] = 1.0
    query[0, 15 * 256 + 1] = 1.0  # both codes score 16
    with looks.settings(shortlist=1, near_copy=2.0):
        scores, ids = index.search(query, 50, looks=looks.look(pictures[40:41]))
    assert scores[0].tolist() == [16.0] * 50
    assert ids[0, 0] == 40 and sorted(ids[0].tolist()) == list(range(50))


def test_looks_survive_save_load_remove_and_shard(rng, tmp_path):
    codes = rng.integers(0, 2, (200, 3))
    pictures = _pictures(rng, 200)
    index = SubicIndex(3, 8, looks=True)
    index.add(codes, looks=looks.look(pictures))
    queries = rng.random((4, 24)).astype(np.float32)
    query_looks = looks.look(pictures[[3, 30, 60, 90]])
    expected = index.search(queries, 20, looks=query_looks)
    index.save(tmp_path / "a.subic")
    loaded = load_index(tmp_path / "a.subic")
    assert loaded.has_looks and loaded.bytes_per_item == 2 + 8 + looks.LOOK_SIZE
    assert np.array_equal(loaded.get_looks(), index.get_looks())
    for got, want in zip(loaded.search(queries, 20, looks=query_looks), expected):
        np.testing.assert_array_equal(got, want)
    index.remove(np.arange(0, 200, 2))
    assert np.array_equal(index.get_looks(), looks.look(pictures[1::2]))
    assert np.array_equal(index.get_looks([5, 1]), looks.look(pictures[[5, 1]]))
    first, second = index.shard(2)
    assert np.array_equal(
        np.concatenate([first.get_looks(), second.get_looks()]), index.get_looks()
    )


def test_an_image_index_keeps_looks_and_an_old_file_searches_as_before(rng, tmp_path):
    codes = rng.integers(0, 2, (40, 2))
    pictures = _pictures(rng, 40)
    paths = [f"c/{i}.png" for i in range(40)]
    index = ImageIndex(2, 4, tmp_path)
    assert index.has_looks
    index.add(codes, paths, looks=looks.look(pictures))
    queries = rng.random((2, 8)).astype(np.float32)
    query_looks = looks.look(pictures[[7, 9]])
    refined = index.search(queries, 5, looks=query_looks)
    assert refined[1][:, 0].tolist() == [7, 9]  # near copies of themselves
    index.save(tmp_path / "i.subic")
    assert (
        load_index(tmp_path / "i.subic")
        .search(queries, 5, looks=query_looks)[1]
        .tolist()
        == refined[1].tolist()
    )
    # An index written without looks (as version 3 files are) ignores the
    # queries' looks: ties in insertion order.
    old = ImageIndex(2, 4, tmp_path, looks=False)
    old.add(codes, paths)
    old.save(tmp_path / "old.subic")
    assert not (tmp_path / "old.subic").read_bytes()[20] & 4  # no looks section
    reloaded = load_index(tmp_path / "old.subic")
    assert not reloaded.has_looks
    assert (
        reloaded.search(queries, 5, looks=query_looks)[1].tolist()
        == old.search(queries, 5)[1].tolist()
    )
    with pytest.raises(ValueError, match="given to an index that keeps none"):
        old.add(codes[:1], ["x.png"], looks=looks.look(pictures[:1]))


def test_looks_of_your_own_and_their_mistakes(rng, tmp_path):
    features = rng.random((30, 256)).astype(np.float32)
    own = looks.int8_looks(features, dims=32)
    assert own.shape == (30, 32) and own.dtype == np.int8
    index = SubicIndex(2, 4, looks=32)
    index.add(rng.integers(0, 4, (30, 2)), looks=own)
    index.save(tmp_path / "own.subic")
    assert load_index(tmp_path / "own.subic").look_size == 32
    with pytest.raises(ValueError, match=r"int8 \(1, 32\).*int8 \(1, 108\)"):
        index.add([[0, 0]], looks=looks.look(_pictures(rng, 1)))
    with pytest.raises(ValueError, match="looks must be given"):
        index.add([[0, 0]])
    # The thumbnails a command passes are of no use to other looks: the
    # answer is the codes' own, not an error.
    thumbnails = looks.look(_pictures(rng, 1))
    query = np.ones((1, 8), np.float32)
    rows = index.answer(query, 5, looks=thumbnails)[0]
    assert [row["id"] for row in rows] == index.search(query, 5)[1][0].tolist()
    with pytest.raises(ValueError, match="given to an index that keeps none"):
        SubicIndex(2, 4).add([[0, 0]], looks=own[:1])
    with pytest.raises(ValueError, match="looks were given to search an index"):
        SubicIndex(2, 4).search(np.ones((1, 8), np.float32), 1, looks=own[:1])
    with pytest.raises(ValueError, match=r"looks must be True, False or a size.*-3"):
        SubicIndex(2, 4, looks=-3)
    with pytest.raises(ValueError, match=r"dims must be in \[1, 256\], received 0"):
        looks.int8_looks(features, dims=0)
    with pytest.raises(ValueError, match="shortlist must be >= 1, received 0"):
        with looks.settings(shortlist=0):
            pass


def test_crafted_looks_are_refused(rng, tmp_path):
    import hashlib

    index = SubicIndex(2, 4, looks=True)
    index.add(rng.integers(0, 4, (10, 2)), looks=looks.look(_pictures(rng, 10)))
    path = tmp_path / "x.subic"
    index.save(path)
    body = bytearray(path.read_bytes()[:-32])
    for size, message in [(0, "overrun"), (2**40, "overrun"), (200, "overrun")]:
        crafted = body[:-8] + size.to_bytes(8, "little")
        path.write_bytes(bytes(crafted) + hashlib.sha256(crafted).digest())
        with pytest.raises(ValueError, match=message):
            load_index(path)


@pytest.mark.skipif(not native.kernels(), reason="the native scan is not built")
def test_the_native_order_is_the_numpy_one(rng, monkeypatch):
    """The C refinement (AVX2 and portable dot products) and its NumPy
    fallback give the same order, on candidates with equal scores, equal
    looks (equal likeness), near copies, stand-outs, shortlists of every
    size, looks of 8 to 4,096 bytes (a tail past the last 16) and queries
    of one to `VIEWS` views."""
    runs = native.dots()
    assert runs[0] == "portable" and set(runs) <= set(native.DOTS)
    assert ("avx2" in runs) == ("avx2" in native.kernels())
    assert native.dots_for("auto") == runs[-1]
    assert native.dots_for("native-avx2") == ("avx2" if "avx2" in runs else "portable")
    assert native.dots_for("native-neon") == "portable"
    for _ in range(60):
        nq, c = int(rng.integers(1, 5)), int(rng.integers(2, 400))
        d = int(rng.choice([8, 96, 108, 1000, 4096]))
        palette = rng.integers(-128, 128, (int(rng.integers(2, 30)), d), dtype=np.int8)
        palette[0] = 0  # a look of all zeros: likeness 0, not NaN
        table = palette[rng.integers(0, len(palette), 2 * c)]
        positions = np.stack([rng.permutation(2 * c)[:c] for _ in range(nq)])
        scores = -np.sort(-rng.integers(0, 6, (nq, c)).astype(np.float64), axis=1)
        views = int(rng.choice([1, 3, looks.VIEWS]))  # a view per query, or more
        query_looks = palette[rng.integers(0, len(palette), (nq, views))]
        items = looks.Candidates(0, lambda p, table=table: (table, p), None)
        k = int(rng.integers(1, c + 1))
        near = float(rng.choice([0.5, 0.9, 2.0]))
        standout = float(rng.choice([0.05, 0.3, 2.0]))
        shortlist = int(rng.integers(1, c + 1))
        with looks.settings(near_copy=near, standout=standout, shortlist=shortlist):
            in_c = looks._ordered(scores, positions, items, query_looks, k)
            with monkeypatch.context() as patch:
                patch.setattr(native, "kernels", lambda: ())
                in_numpy = looks._ordered(scores, positions, items, query_looks, k)
        np.testing.assert_array_equal(in_c, in_numpy)
        # Each kind of dot products this CPU runs (portable C, as a CPU
        # without AVX2 takes them; AVX2; AVX-512BW; AVX-512 VNNI).
        for dots in runs:
            forced = native.refine(
                table, positions, scores, positions, query_looks,
                scores[:, shortlist - 1], k, near, standout, looks.STANDOUT_FLOOR,
                dots,
            )  # fmt: skip
            np.testing.assert_array_equal(forced, in_numpy, err_msg=dots)
    with pytest.raises(ValueError, match="row lies outside the table"):
        native.refine(
            table, positions + 10**6, scores, positions, query_looks,
            scores[:, 0], 1, 0.9, 0.05, 0.6,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"dots must be one of .*received 'sse'"):
        native.refine(
            table, positions, scores, positions, query_looks,
            scores[:, 0], 1, 0.9, 0.05, 0.6, "sse",
        )  # fmt: skip
