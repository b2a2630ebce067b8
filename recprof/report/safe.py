"""Escaping for every place trace-derived text reaches the page.

Kernel, op and process-group names come from files anyone can write, so the report treats them
as hostile. Three sinks need three treatments:

- HTML text and attributes: Jinja2 autoescape (the template environment turns it on).
- JSON inside ``<script type="application/json">``: `script_json` escapes ``<``, ``>``, ``&``
  and U+2028/U+2029 as ``\\uXXXX`` so no string can close the script element or start a
  comment, and the text stays valid JSON *and* a valid JavaScript literal.
- Plotly labels, tick text and hover text: plotly renders a subset of HTML tags there
  (``<b>``, ``<a href>``, ``<br>`` ...) and decodes entities, so `plot_text` entity-escapes the
  string; plotly then shows the original characters literally instead of interpreting them.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any

from markupsafe import Markup

# Characters that could end a <script> element, open an HTML comment or a CDATA section, or
# (U+2028/U+2029) break a JavaScript string literal in engines before ES2019.
_SCRIPT_ESCAPES = {
    ord("<"): "\\u003c",
    ord(">"): "\\u003e",
    ord("&"): "\\u0026",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def script_json(value: Any) -> Markup:
    """JSON text that is safe to place verbatim between ``<script>`` tags.

    ``allow_nan=False`` because NaN/Infinity are not JSON and would make ``JSON.parse`` throw
    in the browser; callers must turn missing numbers into ``None`` first.
    """
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Markup(text.translate(_SCRIPT_ESCAPES))


def plot_text(value: object) -> str:
    """Entity-escape a string for plotly, which renders a small HTML subset in its labels.

    Only ``&``, ``<`` and ``>``: with no ``<`` left no tag (and so no attribute) can start,
    and plotly decodes ``&lt;``/``&gt;``/``&amp;`` but shows ``&quot;`` verbatim, so quotes
    stay as they are to read literally.
    """
    return html.escape(str(value), quote=False)


def finite(value: Any) -> Any:
    """`value` with every NaN/±inf float (anywhere in lists/dicts) replaced by None.

    Analysis numbers can be non-finite (a zero-duration collective has infinite bandwidth);
    plotly treats None as a gap, whereas a NaN would make the page's JSON invalid.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
