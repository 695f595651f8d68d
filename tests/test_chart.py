"""Chart drawing: valid SVG with the data where it belongs, and atomic writes."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET

import pytest

from edge.memory import chart as charts
from edge.memory.chart import Band, Chart, ChartError, Line, _ticks, html_page, svg, write_atomic

SVG_NS = "{http://www.w3.org/2000/svg}"


def example() -> Chart:
    c = Chart("Memory", "seconds", "MiB", bands=[Band("prefill", 0, 1), Band("decode", 1, 3)],
              lines=[Line("budget", 120.0), Line("predicted", 110.0, "#777")], markers=[("run", 2.0, 90.0)])
    c.series["rss <&>"] = [(0.0, 50.0), (1.0, 100.0), (3.0, 100.0)]
    return c


def test_svg_is_well_formed_and_places_points_by_value():
    root = ET.fromstring(svg(example()))
    assert root.tag == SVG_NS + "svg"
    line = root.find(SVG_NS + "polyline")
    points = [tuple(map(float, p.split(","))) for p in line.get("points").split()]
    xs, ys = zip(*points)
    assert xs[0] < xs[1] < xs[2] and ys[0] > ys[1] == ys[2]  # higher values sit higher (smaller y)
    assert line.find(SVG_NS + "title").text == "rss <&>"  # escaped in the markup, intact once parsed
    labels = {t.text for t in root.iter(SVG_NS + "text")}
    assert {"prefill", "decode", "budget", "predicted", "run"} <= labels


def test_ticks_cover_the_range_with_round_steps():
    assert _ticks(0, 277.3) == [0, 100, 200]
    assert _ticks(0.0, 3.4) == [0.0, 1.0, 2.0, 3.0]
    assert _ticks(100, 4096)[-1] == 4000


def test_page_is_standalone():
    page = html_page("t", [example()], [("caption", "<table></table>")], notes="a < b")
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page and "a &lt; b" in page


def test_write_atomic_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "c.html"
    write_atomic(target, "first")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(charts.os, "replace", broken_replace)
    with pytest.raises(OSError):
        write_atomic(target, "second")
    assert target.read_text() == "first" and os.listdir(tmp_path) == ["c.html"]
    with pytest.raises(ChartError, match="does not exist"):
        write_atomic(tmp_path / "missing" / "c.html", "x")
