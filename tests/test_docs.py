"""The docs say what the code does: each file's schema as the code writes it (a reader who
checks a file's `schema` against docs/ must find the same version: docs/capture.md named the
analysis `recprof.analysis/1` after the files had said `/2`), and the README's first lines
open the report where capture writes it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: `recprof.analysis/2`, `recprof.capture.manifest/1`, ...
SCHEMA = re.compile(r"recprof(?:\.[a-z_]+)+/\d+")


def _written() -> dict[str, str]:
    """Each schema's name -> the version the code writes: every `...SCHEMA = "name/N"`
    assignment in recprof/ and tuner/."""
    found: dict[str, str] = {}
    for path in [*(REPO / "recprof").rglob("*.py"), *(REPO / "tuner").rglob("*.py")]:
        for match in re.finditer(r'^[A-Z_]*SCHEMA = "(recprof(?:\.[a-z_]+)+)/(\d+)"',
                                 path.read_text(), re.MULTILINE):
            found[match.group(1)] = match.group(2)
    return found


def test_every_schema_the_docs_name_is_the_one_written() -> None:
    written = _written()
    assert written.get("recprof.analysis") and written.get("recprof.capture.manifest")
    stale = []
    for doc in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for named in SCHEMA.findall(line):
                name, version = named.rsplit("/", 1)
                if name in written and written[name] != version:
                    stale.append(f"{doc.relative_to(REPO)}:{number}: {named} "
                                 f"(written: {name}/{written[name]})")
    assert not stale, "\n".join(stale)


def test_the_readme_opens_the_report_where_capture_writes_it() -> None:
    """The README's first lines: `open <where capture writes the report>`, capture's default
    run folder and report name."""
    from recprof.flows.capture import DEFAULT_ROOT
    from recprof.runfolder.layout import REPORT

    lines = (REPO / "README.md").read_text().splitlines()
    (opened,) = [line.split()[1] for line in lines[:20] if line.startswith("open ")]
    assert opened == f"{DEFAULT_ROOT}/<run>/{REPORT}", opened
