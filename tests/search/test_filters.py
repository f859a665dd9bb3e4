"""`subic_keras.search.filters`: the expression language and its masks."""

import numpy as np
import pytest

from subic_keras.search import filter_terms, filters
from subic_keras.search.items import IdColumns, ItemTable


@pytest.fixture(autouse=True)
def scanner():
    """One run: filters do not depend on the scanner."""
    return "none"


@pytest.fixture
def table():
    table = ItemTable()
    paths = ["cat/a.png", "cat/old/b.png", "dog/c.png", "catnip.png", "d.png"]
    attributes = [
        {"year": 2020, "fav": True, "by": "ann"},
        {"year": 2024.5},
        {"year": "2021", "fav": False},
        None,
        {"by": "bob", "fav": True},
    ]
    table.append(
        np.array([10, 11, 12, 13, 14]),
        paths,
        np.zeros(5, np.uint64),
        np.array([100.0, 200.0, 300.0, 400.0, 0.0]),
        attributes,
    )
    return table


@pytest.mark.parametrize(
    "text, kept",
    [
        ("id == 12", [12]),
        ("id in [10, 14, 99]", [10, 14]),
        ("id >= 11 and id < 13", [11, 12]),
        ("not id > 11", [10, 11]),
        ("class == 'cat'", [10, 11]),
        ('class == ""', [13, 14]),
        ('path under "cat"', [10, 11]),  # not catnip.png: a folder boundary
        ('path under "cat/old/"', [11]),
        ("path == 'd.png' or added >= 300", [12, 13, 14]),
        ("attrs.year >= 2021", [11]),  # "2021" is a string: not a number
        ("attrs.year == '2021'", [12]),
        ("attrs.fav == true", [10, 14]),
        ("attrs.fav != true", [12]),  # items without fav are not compared
        ("attrs.by in ['bob', 'eve']", [14]),
        ("attrs.nothing == 1", []),
        ("(id == 10 or id == 11) and not (class == 'cat' and attrs.year < 2021)", [11]),
        ("not not not id == 10", [11, 12, 13, 14]),
        ("class=='dog'or id==13", [12, 13]),
        ("path == 'it\\'s'", []),
    ],
)
def test_expressions_keep_what_they_say(table, text, kept):
    mask = filters.parse(text).mask(table)
    assert table.ids[mask].tolist() == kept


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("colour == 'red'", "unknown field 'colour'"),
        ("id == ", "expected a value, found the end"),
        ("id = 3", "unexpected character '='"),
        ("id == 3 and", "expected a name, found the end"),
        ("(id == 3", "expected '\\)', found the end"),
        ("id == 3)", "unexpected '\\)'"),
        ("id ~ 3", "unexpected character '~'"),
        ("class under 'x'", "'under' applies to path"),
        ("path under 3", "'under' takes a folder in quotes"),
        ("id in [1, 2", "expected '\\]'"),
        ("id", "expected a comparison"),
        ("id == 1e999", "out of range"),
        ("(" * 40 + "id == 1" + ")" * 40, "more than 32 nested"),
        ("id == 'x'", None),  # parses; the type is checked on evaluation
    ],
)
def test_bad_expressions_say_what_and_where(text, message):
    if message is None:
        filters.parse(text)
        return
    with pytest.raises(ValueError, match=message):
        filters.parse(text)


def test_type_mismatches_on_built_in_fields_are_errors(table):
    with pytest.raises(ValueError, match='id is a number, received "x"'):
        filters.parse("id == 'x'").mask(table)
    with pytest.raises(ValueError, match="path is a string, received 3"):
        filters.parse("path == 3").mask(table)
    with pytest.raises(ValueError, match="compare with == and != only"):
        filters.parse("attrs.fav < true").mask(table)


def test_indexes_of_codes_alone_filter_on_ids_only():
    columns = IdColumns(np.array([5, 6, 7]))
    assert filters.parse("id != 6").mask(columns).tolist() == [True, False, True]
    with pytest.raises(
        ValueError, match="filtered on id alone, received a test on 'class'"
    ):
        filters.parse("class == 'x'").mask(columns)


def test_where_takes_text_filters_and_ids():
    assert filters.as_filter(None) is None
    assert str(filters.as_filter("id == 1")) == "id == 1"
    assert str(filters.as_filter([3, 1, 3])) == "id in [1, 3]"
    assert str(filters.as_filter(np.array([], np.int64))) == "id in []"
    both = filters.parse("id == 1") & ~filters.ids([2])
    assert str(both) == "(id == 1) and (not (id in [2]))"
    with pytest.raises(ValueError, match="where must be >= 0"):
        filters.as_filter([-1])
    with pytest.raises(TypeError, match="where must be a filter expression"):
        filters.as_filter({"id": 1})
    with pytest.raises(ValueError, match="at most 1000000 characters"):
        filters.parse("id == 1 or " * 100_000 + "id == 2")


def test_milvus_expressions_cover_ids():
    assert filters.parse("id in [1, 2] or not id < 5").milvus() == (
        "(id in [1, 2]) or (not (id < 5))"
    )
    with pytest.raises(ValueError, match="on id alone"):
        filters.parse("attrs.x == 1").milvus()


def test_folders_are_every_level_holding_a_path(table):
    assert table.folders() == ["cat", "cat/old", "dog"]


def test_long_chains_are_loops_not_recursion(table):
    # 10,000 tests `or`ed (and `and`ed): parsed, evaluated, printed, keyed,
    # turned into Milvus's expression and pickled (Ray) without recursion.
    import pickle
    import sys

    chain = " or ".join(f"id == {i}" for i in range(10_000))
    both = " and ".join(["id != 99"] * 10_000)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # far below what a nested chain would need
    try:
        for text, kept in ((chain, [10, 11, 12, 13, 14]), (both, [10, 11, 12, 13, 14])):
            where = filters.parse(text)
            assert where.depth == 2
            assert table.ids[where.mask(table)].tolist() == kept
            assert filters.parse(str(where)).mask(table).tolist() == [True] * 5
            assert len(where.milvus()) > 100_000 and where.cache_key()
            assert pickle.loads(pickle.dumps(where)) == where
    finally:
        sys.setrecursionlimit(limit)
    # Parentheses nest as deep as the text allows; a filter built in Python
    # nests no deeper.
    deep = "(not " * 16 + "id == 10 or id == 11 and id == 12" + ")" * 16
    assert filters.parse(deep).depth <= filters.MAX_NESTING
    built = filters.parse("id == 10")
    with pytest.raises(ValueError, match="nest at most 100 deep"):
        for _ in range(100):
            built = ~(built | filters.parse("id == 11"))


@pytest.mark.parametrize(
    "text, kept",
    [
        ("id in [11.5]", []),  # a float that is no integer equals no id
        ("id in [-0.5, 12.0]", [12]),
        ("id == 11.0", [11]),
        ("id != 11.5", [10, 11, 12, 13, 14]),
        ("id < 11.5", [10, 11]),
        ("id <= 11.5", [10, 11]),
        ("id > 12.5", [13, 14]),
        ("id >= 12.5", [13, 14]),
        ("id < -0.5", []),
        ("id > 9223372036854775807", []),
        ("path == 'd.png\0'", []),  # NUL kept, so no path matches
        ("class == 'cat\0'", []),
        ("path in ['d.png\0']", []),
        ("path == 'd.png'", [14]),
    ],
)
def test_numbers_and_strings_compare_exactly(table, text, kept):
    assert table.ids[filters.parse(text).mask(table)].tolist() == kept


def test_numbers_beyond_int64_bound_every_id_and_large_ones_compare_exactly():
    table = ItemTable()
    big = 2**53
    table.append(
        np.arange(4),
        ["a.png", "b.png", "c.png", "d.png"],
        np.zeros(4, np.uint64),
        np.zeros(4),
        [{"n": big}, {"n": big + 1}, {"n": 2**62 + 1}, {"n": 0.5}],
    )
    for text, kept in (
        (f"attrs.n == {big}", [0]),  # as floats, big + 1 would equal it too
        (f"attrs.n == {big + 1}", [1]),
        (f"attrs.n > {big}", [1, 2]),
        (f"attrs.n in [{2**62 + 1}]", [2]),
        ("attrs.n < 1", [3]),
        (f"attrs.n == {float(big)}", [0]),
    ):
        assert table.ids[filters.parse(text).mask(table)].tolist() == kept, text
    # Compared as numbers: a bound past every id keeps all or none, here
    # and in Milvus's expression alike.
    for text, kept, milvus in (
        ("id < 1e300", [0, 1, 2, 3], "id >= 0"),
        ("id > -1e300", [0, 1, 2, 3], "id >= 0"),
        ("id < 9223372036854775808", [0, 1, 2, 3], "id >= 0"),
        ("id in [1e300]", [], "id < 0"),
        ("id > 1e19", [], "id < 0"),
        ("id == -1e19", [], "id < 0"),
        ("id in []", [], "id < 0"),
        ("not id in []", [0, 1, 2, 3], "not (id < 0)"),
        ("id in [1e300, 2]", [2], "id in [2]"),
    ):
        filtered = filters.parse(text)
        assert table.ids[filtered.mask(table)].tolist() == kept, text
        assert filtered.milvus() == milvus, text


def test_lone_surrogates_are_refused_at_add_naming_the_item(tmp_path):
    from subic_keras.search import ImageIndex

    index = ImageIndex(2, 4, str(tmp_path), (8, 8, 3))
    with pytest.raises(ValueError, match=r"valid UTF-8.*'\\udc80'.*for 'b.png'"):
        index.add(
            np.zeros((2, 2), int),
            ["a.png", "b.png"],
            attributes=[None, {"t": "\udc80"}],
        )
    assert len(index) == 0


def test_milvus_expressions_of_a_folder_collection():
    held = filter_terms.ON_PICTURES
    under = filters.parse("path under 'a/b/'")
    assert under.milvus(held) == 'path >= "a/b/" and path < "a/b0"'
    assert filters.parse("path under ''").milvus(held) == "id >= 0"
    odd = 'say "hi"\\\n\r\t\x07é.png'
    assert filters.Compare("path", "==", odd).milvus(held) == (
        'path == "say \\"hi\\"\\\\\\n\\r\t\x07é.png"'
    )
    both = filters.parse("not (class in ['a', 'b']) or added >= 1.5")
    assert both.milvus(held) == ('(not (class in ["a", "b"])) or (added >= 1.5)')
    with pytest.raises(ValueError, match="class is a string, received 3"):
        filters.parse("class == 3").milvus(held)
    # An attribute under its kind's key, false where an item lacks it.
    assert filters.parse("attrs.x <= 1.5").milvus(held) == (
        '(exists attributes["number:x"] and attributes["number:x"] <= 1.5)'
    )
    assert filters.parse("attrs.x in ['a', true]").milvus(held) == (
        '(exists attributes["string:x"] and attributes["string:x"] == "a") or '
        '(exists attributes["bool:x"] and attributes["bool:x"] == true)'
    )
    with pytest.raises(ValueError, match="compare with == and != only"):
        filters.parse("attrs.x < true").milvus(held)
    with pytest.raises(ValueError, match="filtered on id alone, received a test on"):
        under.milvus()


def test_attributes_at_the_int64_bounds_are_kept_exactly(tmp_path):
    from subic_keras.search import ImageIndex
    from subic_keras.search import open as search_open

    index = ImageIndex(2, 4, str(tmp_path), (8, 8, 3))
    index.add(
        np.zeros((2, 2), int),
        ["low.png", "high.png"],
        attributes=[{"n": -(2**63)}, {"n": 2**63 - 1}],
    )
    index.save(tmp_path / "bounds.subic")
    loaded = search_open(tmp_path / "bounds.subic")
    kept = [row["attributes"]["n"] for row in loaded.describe(loaded.get_ids())]
    assert kept == [-(2**63), 2**63 - 1]
    query = np.zeros((1, 8))
    low = loaded.answer(query, 2, where=f"attrs.n == {-(2**63)}")[0]
    assert [row["path"] for row in low] == ["low.png"]
    for beyond in (2**63, -(2**63) - 1):
        with pytest.raises(ValueError, match="integers of 64 bits"):
            index.add(np.zeros((1, 2), int), ["x.png"], attributes=[{"n": beyond}])
