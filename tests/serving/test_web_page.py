"""The web page of `subic serve`, driven in a real headless Chromium.

Needs Debian's `chromium` and the `playwright` package (no browser is
downloaded): the test is skipped where either is missing, unless
`SUBIC_REQUIRE_BROWSER=1` (as in CI) makes that a failure.
"""

import contextlib
import os
import shutil
import time
import urllib.parse

import pytest
from served import ServeProcess, ruled_instance, save_model

from subic_keras.config import CLASS_NAMES
from subic_keras.data.datasets import load_cifar10
from subic_keras.data.images import write_image_folder
from subic_keras.search import filters
from subic_keras.serving import retrieval
from subic_keras.serving.export import load_encoder, load_subic

# Integration tests (processes, servers, exports): `-m "not slow"` skips them.
pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Flags for a root user on a machine without network or GPU.
_BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _browser():
    missing = []
    if not os.path.exists(CHROMIUM):
        missing.append("Debian's chromium package")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing.append("the playwright package")
        sync_playwright = None
    if missing:
        message = f"the browser test needs {' and '.join(missing)}"
        if os.environ.get("SUBIC_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return sync_playwright


@contextlib.contextmanager
def _page(playwright, server, pictures: int):
    """The page of `server` in Chromium, loaded: its stats name `pictures`."""
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=_BROWSER_ARGS)
    try:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(f"http://127.0.0.1:{server.port}/")
        page.wait_for_function(
            "document.getElementById('stats').textContent.includes("
            f"'{pictures} pictures')"
        )
        yield page
    finally:
        browser.close()


@pytest.fixture(scope="module")
def served_cifar(shared_data_dir, tmp_path_factory):
    """`subic serve` over 200 CIFAR-10 test pictures written as PNG folders."""
    sync_playwright = _browser()
    base = tmp_path_factory.mktemp("web")
    _, (images, labels) = load_cifar10(
        shared_data_dir / "cifar-10-batches-bin", max_per_split=200
    )
    paths = write_image_folder(images, labels, base / "photos", CLASS_NAMES["cifar10"])
    model = save_model(base / "model.keras")
    index, _ = retrieval.index_folder(load_subic(model), base / "photos")
    index.save(base / "photos.subic")
    with ServeProcess(model, str(base / "photos.subic")) as server:
        yield server, base, paths, sync_playwright


def _a_search_marks_the_old_matches_stale(page, base, paths) -> None:
    # While a search runs, the old matches are marked stale and the
    # old prediction is gone. The request is held until the page has
    # been read: a handler that sleeps and continues would let the
    # answer arrive before the read (the handler runs while Python
    # waits for the page).
    held = []

    def hold(route):
        held.append(route)

    page.route("**/search?**", hold)
    page.set_input_files("#file", str(base / "photos" / paths[40]))
    page.wait_for_function(
        "document.getElementById('grid').classList.contains('stale')"
    )
    assert page.inner_text("#query-info") == ""
    assert page.inner_text("#summary") == "searching…"
    for _ in range(1000):  # the handler runs as Python waits: 10 s at most
        if held:
            break
        page.wait_for_timeout(10)
    assert len(held) == 1
    held[0].continue_()
    page.unroute("**/search?**")
    page.wait_for_function(
        "!document.getElementById('grid').classList.contains('stale')"
    )
    assert "predicted: class " in page.inner_text("#query-info")


def _k_is_bounded_by_the_index(page) -> None:
    # k beyond the index: bounded by what it holds, not refused.
    page.fill("#k", "5000")
    page.dispatch_event("#k", "change")
    page.wait_for_function("document.querySelectorAll('#grid .card').length === 200")
    assert page.input_value("#k") == "200"
    page.fill("#k", "12")
    page.dispatch_event("#k", "change")
    page.wait_for_function("document.querySelectorAll('#grid .card').length === 12")


def _the_folder_filter_searches_within_one(page, paths, clicked, requests) -> None:
    # The folder filter: the search runs again within one folder,
    # the server filtering inside its scan.
    folder = next(p for p in paths if not p.startswith(clicked.split("/")[0]))
    folder = folder.split("/")[0]
    options = page.locator("#under option").all_inner_texts()
    assert options[0] == "all folders" and folder in options
    page.select_option("#under", folder)
    page.wait_for_function(
        f"document.getElementById('summary').textContent.includes('in {folder}/')"
    )
    shown = page.locator("#grid .card")
    assert shown.count() == min(12, sum(p.startswith(folder + "/") for p in paths))
    assert all(
        shown.nth(i).get_attribute("data-path").startswith(folder + "/")
        for i in range(shown.count())
    )
    assert any(f"where=path%20under%20%22{folder}%22" in url for url in requests)
    page.select_option("#under", "")
    # A folder whose name holds a newline, a tab, a quote and a
    # backslash is asked for as itself (the filter language's
    # string, not JSON's), and a filter that keeps nothing says so.
    odd = 'no\nsuch\t"folder\\'
    page.evaluate("(name) => $('under').append(new Option(name, name))", odd)
    page.select_option("#under", odd)
    page.wait_for_function(
        "document.getElementById('summary').textContent.startsWith("
        "'no match: no picture in ')"
    )
    assert page.locator("#grid .card").count() == 0
    asked = [url for url in requests if "where=" in url][-1]
    where = urllib.parse.parse_qs(urllib.parse.urlsplit(asked).query)
    assert filters.parse(where["where"][0]).folder == odd
    page.select_option("#under", "")


def _a_file_that_is_not_a_picture_is_named(page, base) -> None:
    # A file that is not a picture: the page says so.
    (base / "notes.txt").write_text("not a picture")
    page.set_input_files("#file", str(base / "notes.txt"))
    page.wait_for_function(
        "document.getElementById('error').textContent.includes('not a picture')"
    )
    assert page.locator("#grid .card").count() == 0
    # ... and nothing of it stays: no query picture, no prediction.
    assert not page.locator("#query-image").is_visible()
    assert page.inner_text("#query-info") == ""


def test_upload_shows_the_matches_and_a_click_searches_with_one(served_cifar):
    server, base, paths, sync_playwright = served_cifar
    query = paths[17]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=_BROWSER_ARGS
        )
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            requests = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(f"http://127.0.0.1:{server.port}/")
            page.wait_for_function(
                "document.getElementById('stats').textContent.includes('200 pictures')"
            )
            page.set_input_files("#file", str(base / "photos" / query))
            page.wait_for_selector("#grid .card")
            cards = page.locator("#grid .card")
            assert cards.count() == 12
            assert cards.nth(0).get_attribute("data-path") == query
            assert cards.nth(0).locator(".badge").inner_text() == "query"
            assert "matches in" in page.inner_text("#summary")
            assert "predicted: class " in page.inner_text("#query-info")
            # An untrained model over 3 classes: a prediction near chance,
            # marked as uncertain.
            assert "uncertain, close to chance" in page.inner_text("#query-info")
            # A tie group is named as such.
            scores = [
                cards.nth(i).locator(".score").inner_text().split("score ")[1]
                for i in range(cards.count())
            ]
            shared = max(scores.count(score) for score in scores)
            assert ("share score" in page.inner_text("#summary")) == (shared > 1)
            if shared > 1:  # no instance codes: ties in insertion order
                assert "in the order they were indexed" in page.inner_text("#summary")
            # Every thumbnail loaded from the server.
            page.wait_for_function(
                "[...document.querySelectorAll('#grid img')]"
                ".every(i => i.complete && i.naturalWidth === 32)"
            )
            page.screenshot(path=str(base / "page.png"))
            # A click on a match searches with it: it comes first.
            clicked = cards.nth(3).get_attribute("data-path")
            cards.nth(3).click()
            page.wait_for_function(
                f"document.querySelector('#grid .card').dataset.path === {clicked!r}"
            )
            # Matches are reached by keyboard: Enter searches with one.
            target = cards.nth(2).get_attribute("data-path")
            cards.nth(2).focus()
            page.keyboard.press("Enter")
            page.wait_for_function(
                f"document.querySelector('#grid .card').dataset.path === {target!r}"
            )

            _a_search_marks_the_old_matches_stale(page, base, paths)
            _k_is_bounded_by_the_index(page)
            _the_folder_filter_searches_within_one(page, paths, clicked, requests)
            _only_the_latest_answer_is_shown(page, base, paths)
            _a_file_that_is_not_a_picture_is_named(page, base)
            # Nothing but this server was asked for anything.
            origin = f"http://127.0.0.1:{server.port}/"
            assert all(
                url.startswith((origin, "blob:", "data:")) for url in requests
            ), requests
        finally:
            browser.close()


def _only_the_latest_answer_is_shown(page, base, paths):
    """Two pictures chosen 30 ms apart, the first one's answer arriving last:
    the page shows the second's matches, never the first's beside the
    second picture."""
    page.evaluate(
        """() => {
          const fetched = window.fetch;
          let searches = 0;
          window.fetch = async (...args) => {
            const answer = await fetched(...args);
            if (String(args[0]).startsWith("/search") && searches++ === 0) {
              await new Promise((done) => setTimeout(done, 1500));
              window.lateAnswerBack = true;
            }
            return answer;
          };
          window.unwrapped = fetched;
        }"""
    )
    first, second = paths[60], paths[61]
    page.set_input_files("#file", str(base / "photos" / first))
    time.sleep(0.03)
    page.set_input_files("#file", str(base / "photos" / second))
    page.wait_for_function(
        f"document.querySelector('#grid .card')?.dataset.path === {second!r}"
        " && !document.getElementById('grid').classList.contains('stale')"
    )
    page.wait_for_function("window.lateAnswerBack === true")
    time.sleep(0.1)  # (the late answer's JSON is read, then dropped)
    assert page.locator("#grid .card").nth(0).get_attribute("data-path") == second
    assert page.inner_text("#summary").startswith("12 matches")
    page.evaluate("() => { window.fetch = window.unwrapped; }")


def test_the_page_of_an_instance_code_names_copies_not_classes(
    shared_data_dir, tmp_path
):
    from PIL import Image

    sync_playwright = _browser()
    (_, _), (images, labels) = load_cifar10(shared_data_dir, max_per_split=60)
    paths = write_image_folder(images[:60], labels[:60], tmp_path / "photos")
    # An exact copy of picture 5 under another name.
    copy = tmp_path / "photos" / "copy.png"
    copy.write_bytes((tmp_path / "photos" / paths[5]).read_bytes())
    index, _ = retrieval.index_folder(load_encoder("instance"), tmp_path / "photos")
    index.save(tmp_path / "photos.subic")
    with ServeProcess("instance", str(tmp_path / "photos.subic")) as server:
        with sync_playwright() as playwright, _page(playwright, server, 61) as page:
            page.set_input_files("#file", str(tmp_path / "photos" / paths[5]))
            page.wait_for_selector("#grid .card")
            cards = page.locator("#grid .card")
            badges = [cards.nth(i).locator(".badge").inner_text() for i in (0, 1)]
            assert sorted(badges) == ["query", "query"]  # both identical
            assert {cards.nth(i).get_attribute("data-path") for i in (0, 1)} == {
                paths[5],
                "copy.png",
            }
            info = page.inner_text("#query-info")
            assert info == "2 copies of this picture found", info
            assert "predicted" not in info
            page.screenshot(path=str(tmp_path / "instance_page.png"))
            # A mirrored copy: found first, unmarked (the shipped code's
            # strict rule does not mark it), and the page says none is.
            mirrored = tmp_path / "mirrored.png"
            Image.open(tmp_path / "photos" / paths[9]).transpose(
                Image.Transpose.FLIP_LEFT_RIGHT
            ).save(mirrored)
            page.set_input_files("#file", str(mirrored))
            page.wait_for_function(
                f"document.querySelector('#grid .card').dataset.path === {paths[9]!r}"
            )
            info = page.inner_text("#query-info")
            assert info == "the most alike first, none marked as a copy", info


def test_the_page_of_both_codes_marks_copies_and_says_how_ties_are_ordered(
    shared_data_dir, tmp_path
):
    import keras
    from PIL import Image

    from subic_keras.instance.instance_code import InstanceSubic

    sync_playwright = _browser()
    (_, _), (images, labels) = load_cifar10(shared_data_dir, max_per_split=60)
    paths = write_image_folder(images[:60], labels[:60], tmp_path / "photos")
    # A class model drawn alike in every run: its ties are what is checked.
    keras.utils.set_random_seed(0)
    model = save_model(tmp_path / "model.keras")
    ruled = ruled_instance(tmp_path / "ruled.keras")  # marks copies
    index, _ = retrieval.index_folder(
        load_subic(model), tmp_path / "photos", instance=InstanceSubic.load(ruled),
        instance_path=ruled,
    )  # fmt: skip
    index.save(tmp_path / "photos.subic")
    # Picture 7 twice as large, recompressed: a copy the instance code marks.
    copy = tmp_path / "copy.jpg"
    picture = Image.open(tmp_path / "photos" / paths[7])
    picture.resize((64, 64), Image.BICUBIC).save(copy, quality=90)
    with ServeProcess(model, str(tmp_path / "photos.subic")) as server:
        with sync_playwright() as playwright, _page(playwright, server, 60) as page:
            page.set_input_files("#file", str(copy))
            page.wait_for_selector("#grid .card")
            first = page.locator("#grid .card").nth(0)
            assert first.get_attribute("data-path") == paths[7]
            assert first.locator(".badge").inner_text() == "copy"
            # The untrained class model gives many pictures one code.
            summary = page.inner_text("#summary")
            assert "ordered by the instance code" in summary, summary
            assert "in the order they were indexed" not in summary
            page.screenshot(path=str(tmp_path / "both_codes_page.png"))
