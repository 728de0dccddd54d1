"""report.html in headless Chromium (the Debian package ``chromium``): it loads offline with no
console errors, asks for nothing but its own file and data: URLs, and a full-page screenshot shows
every figure. A browser that is missing skips these tests locally and fails them under CI=true
(``.ci/run`` installs it)."""
import io
import os

import numpy as np
import pytest
from PIL import Image

from distattn.compare.__main__ import main
from headless_chromium import find_browser, inspect_page
from test_compare import synthetic_jsonl


@pytest.fixture(scope="module")
def browser():
    path = find_browser()
    if path is None:
        msg = "headless Chromium not found (Debian: apt-get install chromium; or set DISTATTN_CHROMIUM)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return path


def figure_pixels(report, image: dict) -> np.ndarray:
    """The screenshot's pixels where ``image`` sits on the page, (height, width, RGB)."""
    shot = np.asarray(Image.open(io.BytesIO(report.screenshot_png)).convert("RGB"), dtype=np.float64)
    x0, y0 = int(round(image["x"])), int(round(image["y"]))
    x1, y1 = int(round(image["x"] + image["width"])), int(round(image["y"] + image["height"]))
    return shot[y0:y1, x0:x1]


def spatial_spread(px: np.ndarray) -> float:
    """The largest per-channel standard deviation over the pixels: 0 for a box of one colour."""
    return float(px.reshape(-1, 3).std(axis=0).max()) if px.size else 0.0


def test_text_corpus_report_in_headless_chromium(tmp_path, capsys, browser):
    corpus = synthetic_jsonl(tmp_path / "c.jsonl")
    code = main(["--corpus", "text", "--path", str(corpus), "--profile", "quick", "--out", str(tmp_path / "runs"),
                 "-q", "--device", "cpu"])
    assert code == 0, capsys.readouterr().err
    report_path = next((tmp_path / "runs").iterdir()) / "report.html"
    rep = inspect_page(report_path, browser=browser)
    assert rep.errors == []
    assert rep.requests and all(u.startswith(("file:", "data:")) for u in rep.requests), rep.requests
    assert rep.title.startswith("distattn report")
    # heatmaps (paper examples and held-out), spectra, graph, CKA, the bank/river figures
    assert len(rep.images) >= 8
    shot = Image.open(io.BytesIO(rep.screenshot_png))
    assert shot.width >= 1000 and shot.height >= max(i["y"] + i["height"] for i in rep.images) - 1
    for img in rep.images:
        assert img["complete"] and img["naturalWidth"] > 0 and img["naturalHeight"] > 0, img
        assert img["width"] > 100 and img["height"] > 100, img             # laid out at a readable size
        px = figure_pixels(rep, img)
        assert spatial_spread(px) > 10, (img["alt"], spatial_spread(px))   # drawn, not a blank box
        # the figure is not cut off: its bottom rows are inside the screenshot too
        assert px.shape[0] >= int(img["height"]) - 1


def test_the_check_sees_a_broken_page(tmp_path, browser):
    """The same inspection on a page with the faults the report must not have."""
    page = tmp_path / "broken.html"
    page.write_text(
        "<!doctype html><html><head><title>broken</title>"
        "<script src='https://cdn.example.invalid/lib.js'></script></head><body>"
        "<img alt='missing' src='does-not-exist.png' width='200' height='200'>"
        "<img alt='blank' width='200' height='200' src='data:image/png;base64,"
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg=='>"
        "<script>console.error('drawn wrong'); undefinedFunction();</script></body></html>")
    rep = inspect_page(page, browser=browser)
    assert any("drawn wrong" in e for e in rep.console_errors)
    assert any("undefinedFunction" in e for e in rep.exceptions)
    assert any(u.startswith("https://cdn.example.invalid") for u in rep.requests)
    missing = next(i for i in rep.images if i["alt"] == "missing")
    assert missing["naturalWidth"] == 0
    blank = next(i for i in rep.images if i["alt"] == "blank")
    assert blank["naturalWidth"] == 1 and spatial_spread(figure_pixels(rep, blank)) < 10


def test_a_missing_browser_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTATTN_CHROMIUM", str(tmp_path / "no-such-browser"))
    assert find_browser() is None
    with pytest.raises(FileNotFoundError, match="no Chromium on PATH"):
        inspect_page(tmp_path / "x.html")


def test_the_browser_writes_nothing_into_the_users_home(tmp_path, browser, monkeypatch):
    """Chromium's crash-report database and dconf settings went to ~/.config/chromium and
    ~/.cache/dconf despite the temporary --user-data-dir: every test session wrote into the home of
    whoever ran it."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    page = tmp_path / "page.html"
    page.write_text("<!doctype html><html><head><title>plain</title></head><body>text</body></html>")
    assert inspect_page(page, browser=browser).title == "plain"
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []
