"""`subic_keras.search.filters`: the expression language and its masks."""

import numpy as np
import pytest

from subic_keras.search import filters
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
