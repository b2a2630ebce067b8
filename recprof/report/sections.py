"""The report's page model: sections made of blocks, which the template only lays out.

A `Section` is a card with an id, a title and an ordered list of blocks (a paragraph, a bullet
list, a plot, a table, the findings, or two blocks side by side). Everything a reader sees is
decided when these objects are built (recprof/report/view.py), so the page is testable without
a browser and the template stays one loop. Any text here may come from a trace: the template
escapes it all (Jinja2 autoescape).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from recprof.analysis.model import Finding


@dataclass
class Paragraph:
    text: str
    css: str = ""
    kind: ClassVar[str] = "paragraph"


@dataclass
class Bullets:
    items: list[str]
    heading: str | None = None
    css: str = ""
    kind: ClassVar[str] = "bullets"


@dataclass
class Plot:
    """A figure's place; its plotly JSON travels in `JobPage.figures` under the same id."""

    id: str
    heading: str | None = None
    note: str = ""
    kind: ClassVar[str] = "plot"


@dataclass
class Column:
    header: str
    numeric: bool = False


@dataclass
class Cell:
    text: str
    sort: float | str | None = None  # what the column sorts by (default: the text)
    sub: str | None = None  # a second, muted line (a share of the step)
    css: str = ""


@dataclass
class Table:
    columns: list[Column]
    rows: list[list[Cell]]
    css: str = ""  # names the table for styling and tests (breakdown, collectives, gaps)
    heading: str | None = None
    note: str = ""
    sortable: bool = True
    kind: ClassVar[str] = "table"


@dataclass
class FindingList:
    findings: list[Finding]
    empty_text: str  # shown when no rule fired
    #: Per finding, the what-if's prediction for its knobs in words ("" where none).
    predicted: list[str] = field(default_factory=list)
    kind: ClassVar[str] = "findings"


@dataclass
class Code:
    """A command line, shown as is (to copy and run)."""

    text: str
    kind: ClassVar[str] = "code"


@dataclass
class SideBySide:
    left: Block
    right: Block
    kind: ClassVar[str] = "side_by_side"


Block = Paragraph | Bullets | Plot | Table | FindingList | Code | SideBySide


@dataclass
class Section:
    id: str  # a DOM id, made only of [a-z0-9-]
    title: str
    blocks: list[Block]
    note: str = ""


@dataclass
class Part:
    """A titled part of a page (one job of the analysis report), its sections, and the figures
    their plots draw (plotly dicts, keyed by the plots' ids)."""

    heading: str | None
    sections: list[Section]
    figures: dict[str, Any] = field(default_factory=dict)
