"""Escaping helpers: what reaches <script> JSON and plotly labels cannot execute or break out."""

from __future__ import annotations

import json

import pytest

from recprof.report.safe import finite, plot_text, script_json

HOSTILE = {
    "a": "</script><script>window.__pwned=1</script>",
    "b": "<!-- <img src=x onerror=alert(1)> -->",
    "c": "AT&T \u2028 line \u2029 para",
    "d": ["\"><svg onload=alert(1)>", "]]>"],
}


def test_script_json_has_no_raw_markup_characters() -> None:
    text = str(script_json(HOSTILE))
    for raw in ("<", ">", "&", "\u2028", "\u2029"):
        assert raw not in text
    assert "\\u003c/script\\u003e" in text


def test_script_json_round_trips_exactly() -> None:
    assert json.loads(str(script_json(HOSTILE))) == HOSTILE


def test_script_json_refuses_nan() -> None:
    # NaN is not JSON: JSON.parse in the browser would throw and blank every chart.
    with pytest.raises(ValueError):
        script_json({"x": float("nan")})


def test_plot_text_leaves_no_tag_start() -> None:
    out = plot_text("<b>x</b> & <a href=\"javascript:alert(1)\">y</a>")
    assert "<" not in out and ">" not in out
    assert out == "&lt;b&gt;x&lt;/b&gt; &amp; &lt;a href=\"javascript:alert(1)\"&gt;y&lt;/a&gt;"


def test_finite_turns_nan_and_inf_into_null() -> None:
    fig = {"data": [{"x": [1.0, float("inf"), float("nan")], "y": (2, -float("inf"))}]}
    assert json.loads(str(script_json(finite(fig)))) == {
        "data": [{"x": [1.0, None, None], "y": [2, None]}]}
