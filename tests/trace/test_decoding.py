"""Typed decoding (recprof/trace/reader.py) refuses, skips and reads exactly what the generic
orjson tree did: the same `TraceFileError` words, the same per-event handling."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson
import pytest

from recprof.trace import load_rank_trace, reader
from recprof.trace.reader import MAX_JSON_DEPTH, TraceFileError, read_bytes, read_trace

OP = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1.0, "dur": 2.0, "pid": 1, "tid": 1}


def _trace(*extra: Any) -> dict[str, Any]:
    return {"traceEvents": [OP, {**OP, "ts": 5.0}, *extra]}


def _write(tmp_path: Path, data: bytes, name: str = "rank0.json") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _orjson_words(data: bytes) -> str:
    with pytest.raises(orjson.JSONDecodeError) as err:
        orjson.loads(data)
    return str(err.value)


def _nested(depth: int) -> bytes:
    """A trace nested `depth` levels in all: its document, the list, an event, then a name."""
    inner = depth - 3
    return b'{"traceEvents":[{"ph":"X","name":' + b"[" * inner + b"]" * inner + b"}]}"


exact_bound_only = pytest.mark.skipif(
    not reader._EXACT_NESTING_BOUND,
    reason="this interpreter (CPython 3.12+) bounds msgspec's nesting by its own C-recursion "
           "limit, which Python code cannot set")


def test_any_nesting_depth_is_read_or_refused_in_one_line_naming_the_file(tmp_path: Path) -> None:
    """On every interpreter: 1,024 levels read, and a file nested far beyond any recursion
    limit (100,000 levels) fails as a TraceFileError, never a crash or a RecursionError."""
    assert len(read_trace(_write(tmp_path, _nested(MAX_JSON_DEPTH))).events) == 1
    path = _write(tmp_path, _nested(100_000), "deep.json")
    with pytest.raises(TraceFileError) as err:
        read_trace(path)
    assert err.value.path == path
    assert err.value.problem.startswith("invalid JSON (")


@exact_bound_only
def test_nesting_is_refused_exactly_where_orjson_refused_it(tmp_path: Path) -> None:
    deepest = _write(tmp_path, _nested(MAX_JSON_DEPTH))
    assert len(read_trace(deepest).events) == 1
    data = _nested(MAX_JSON_DEPTH + 1)
    with pytest.raises(TraceFileError) as err:
        read_trace(_write(tmp_path, data))
    assert err.value.problem == f"invalid JSON ({_orjson_words(data)})"


@exact_bound_only
def test_the_nesting_bound_holds_from_any_caller_however_often_called(tmp_path: Path) -> None:
    """The limit is found afresh per file: one remembered per frame depth let 1,025 levels
    through once the interpreter had specialised a call path (called through `map` after a
    `sorted` key at the same depth)."""
    deepest = _write(tmp_path, _nested(MAX_JSON_DEPTH), "deepest.json")
    deeper = _write(tmp_path, _nested(MAX_JSON_DEPTH + 1), "deeper.json")

    def bound_holds() -> bool:
        if len(read_trace(deepest).events) != 1:
            return False
        with pytest.raises(TraceFileError):
            read_trace(deeper)
        return True

    def nested_call(levels: int) -> bool:
        return bound_holds() if levels == 0 else nested_call(levels - 1)

    for _ in range(3):  # past the interpreter's warm-up of each call site
        assert bound_holds()
        assert nested_call(3)
        assert sorted([0], key=lambda _: bound_holds()) == [0]
        assert list(map(lambda _: bound_holds(), [0])) == [True]


@pytest.mark.parametrize("field,value", [
    ("name", b'"\xff"'),  # invalid UTF-8 in a field that is decoded
    ("ts", b"1e400"),  # beyond float range
    ("dur", b"1" + b"0" * 400),  # an integer beyond float range (orjson reads it as a float)
])
def test_a_decoded_value_orjson_refused_fails_the_file_in_orjson_words(
        tmp_path: Path, field: str, value: bytes) -> None:
    event = orjson.dumps({**OP, field: "@"}).replace(b'"@"', value)
    data = b'{"traceEvents":[' + orjson.dumps(OP) + b"," + event + b"]}"
    with pytest.raises(TraceFileError) as err:
        load_rank_trace(_write(tmp_path, data))
    assert err.value.problem == f"invalid JSON ({_orjson_words(data)})"


def test_an_integer_beyond_64_bits_is_read_as_orjson_read_it(tmp_path: Path) -> None:
    """orjson reads 10**25 as the float 1e+25: a name, it is that text; a pid, it is beyond
    any id and the event is skipped."""
    data = orjson.dumps(_trace()).replace(b'"aten::mm"', b"1" + b"0" * 25, 1)
    data = data.replace(b'"pid":1', b'"pid":' + b"1" + b"0" * 25, 1)
    trace = load_rank_trace(_write(tmp_path, data))
    assert "skipped 1 events whose name, category, pid or tid" in " ".join(trace.warnings)
    data = orjson.dumps(_trace()).replace(b'"aten::mm"', b"1" + b"0" * 25, 1)
    trace = load_rank_trace(_write(tmp_path, data))
    assert "1e+25" in trace.names


def test_elements_that_are_not_event_objects_are_skipped(tmp_path: Path) -> None:
    path = _write(tmp_path, orjson.dumps(_trace(5, "x", [OP], None, True)))
    assert len(load_rank_trace(path).main_thread_ops.start) == 2


def test_the_arguments_of_an_op_that_is_not_a_collective_are_never_decoded(
        tmp_path: Path) -> None:
    """Invalid UTF-8 in an ATen op's `Input Dims`: orjson refused the whole file; nothing
    reads those bytes now, so the file is analysed."""
    data = orjson.dumps(_trace({**OP, "args": {"Input Dims": "@"}})).replace(b'"@"', b'"\xff"')
    assert len(load_rank_trace(_write(tmp_path, data)).main_thread_ops.start) == 3


def test_a_collective_calls_arguments_are_decoded_and_checked(tmp_path: Path) -> None:
    data = orjson.dumps(_trace({**OP, "name": "record_param_comms", "args": {"dtype": "@"}}))
    data = data.replace(b'"@"', b'"\xff"')
    with pytest.raises(TraceFileError) as err:
        load_rank_trace(_write(tmp_path, data))
    assert err.value.problem == f"invalid JSON ({_orjson_words(data)})"


@pytest.mark.parametrize(("odd", "checked", "read_as"), [
    ({"ts": 9, "dur": 2}, True, (9.0, 11.0)),  # integer times (2021 traces), as floats
    ({"pid": 1.0}, False, (9.0, 10.0)),  # a float id equals the int one: the same thread
    ({"name": ""}, False, (9.0, 10.0)),  # an empty name reads as ''
    ({"name": None}, True, (9.0, 10.0)),  # so does a null one
    ({"ts": "9"}, False, None),  # a string time: skipped
    ({"dur": -1.0}, False, None),  # a negative duration: skipped
    ({"pid": 2**60}, False, None),  # an id beyond MAX_COUNT: unbelievable, skipped
])
def test_events_outside_the_checked_form_are_read_loosely_as_before(
        tmp_path: Path, odd: dict[str, Any], checked: bool,
        read_as: tuple[float, float] | None) -> None:
    """msgspec checks the common form while decoding (`CheckedEvent`); anything else goes
    field by field through sanitize, and reads as it always did."""
    path = _write(tmp_path, orjson.dumps(_trace({**OP, "ts": 9.0, "dur": 1.0, **odd})))
    ops = load_rank_trace(path).main_thread_ops
    spans = [(float(a), float(b)) for a, b in zip(ops.start, ops.end, strict=True)]
    assert spans == [(1.0, 3.0), (5.0, 7.0)] + ([read_as] if read_as else [])
    kinds = [type(e).__name__ for e in read_trace(path).consume()]
    assert kinds == ["CheckedEvent"] * 2 + ["CheckedEvent" if checked else "TraceEvent"]


def test_reading_the_events_releases_the_file_text(tmp_path: Path) -> None:
    raw = read_trace(_write(tmp_path, orjson.dumps(_trace())))
    assert raw.data is not None
    assert len(list(raw.consume())) == 2
    assert raw.data is None and raw.events == []


@pytest.mark.parametrize("content,words", [
    (b" \n\t", "file is empty"),
    (b'"trace"', "top-level JSON is a str, not a trace"),
    (b'{"events": []}', "JSON has no 'traceEvents' key; not a Kineto trace"),
    (b'{"traceEvents": {"a": 1}}', "'traceEvents' is not a list"),
    (b'{"traceEvents": []}', "trace holds no events"),
    (b"[]", "trace holds no events"),
])
def test_files_that_are_not_traces(tmp_path: Path, content: bytes, words: str) -> None:
    with pytest.raises(TraceFileError) as err:
        read_trace(_write(tmp_path, content))
    assert err.value.problem == words


def test_a_bare_array_is_a_trace(tmp_path: Path) -> None:
    path = _write(tmp_path, orjson.dumps(_trace()["traceEvents"]))
    assert len(load_rank_trace(path).main_thread_ops.start) == 2


def test_gzip_is_read_as_the_gzip_module_reads_it(tmp_path: Path) -> None:
    text = orjson.dumps(_trace())
    half = len(text) // 2
    members = gzip.compress(text[:half]) + gzip.compress(text[half:]) + b"\0" * 8
    assert read_bytes(_write(tmp_path, members, "rank0.json.gz")) == text
    for data, words in ((gzip.compress(text)[:-9], "not a valid gzip file (Compressed file ended"),
                        (text, "not a valid gzip file (Not a gzipped file (b'{\"')")):
        with pytest.raises(TraceFileError) as err:
            read_bytes(_write(tmp_path, data, "bad.json.gz"))
        assert err.value.problem.startswith(words)


def test_a_gzip_bomb_stops_at_the_limit(tmp_path: Path) -> None:
    bomb = _write(tmp_path, gzip.compress(b" " * (3 << 20)), "rank0.json.gz")
    assert len(read_bytes(bomb, max_bytes=3 << 20)) == 3 << 20
    with pytest.raises(TraceFileError) as err:
        read_bytes(bomb, max_bytes=(3 << 20) - 1)
    assert "refused as a likely gzip bomb" in err.value.problem
