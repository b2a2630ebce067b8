"""Read one Kineto trace file into typed events, turning every way a file can be broken into
one `TraceFileError` that names the file.

Kineto files come as `.json` or `.json.gz`, wrapped (`{"traceEvents": [...]}`) or, in 2021
generations, as a bare array. msgspec decodes them without ever building the generic tree of
dicts `orjson.loads` builds (docs/analysis.md, "Decoding", has the measurements):
- the document once, with `traceEvents` kept as one raw JSON slice per element
  (`msgspec.Raw`, a small object pointing into the text, no copy of it);
- then each element, one at a time as build.py reads it, into a `TraceEvent` holding only the
  fields the trace model reads, so at most one event's objects are alive beside the buffer;
- an event's `args` stay raw until build.py asks for them: most events' arguments (`Input
  Dims` and `Concrete Inputs` of every ATen op) are never decoded.
Every field is typed loosely (`Any`), as a hostile file may put anything anywhere; build.py
checks each value through sanitize.py exactly as it did when the tree was generic. A value
that orjson refused (an invalid UTF-8 string, a number beyond float range) still fails the
file with orjson's words once it is decoded; in bytes that are never decoded it no longer
matters.
"""

from __future__ import annotations

import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
import orjson
from msgspec import Meta
from zlib_ng import gzip_ng, zlib_ng

from recprof.errors import RecprofError
from recprof.trace import sanitize

TRACE_SUFFIXES = (".json", ".json.gz")
#: The most a `.gz` trace may decompress to: a gzip bomb (a few MB of zeros that inflate to
#: tens of GB) is refused here rather than exhausting memory. The largest real trace seen is
#: 61 MB (field notes).
MAX_DECOMPRESSED_BYTES = 4 << 30
#: JSON nesting refused, as orjson (which wrote the analysis before) refuses it: nothing real
#: nests beyond ten levels, and a hostile file nested deeper must fail the same way. Exact on
#: CPython 3.11; from 3.12 the interpreter's own limit applies (_EXACT_NESTING_BOUND).
MAX_JSON_DEPTH = 1024
#: Inflated bytes asked for at a time from a `.gz` file: 64 KB reads took 0.26 ms for a
#: 0.6 MB rank where 1 MB reads took 0.78 (the reader sets up a buffer of the size asked
#: each time), and 52 against 48 ms for 58 MB.
_GZIP_CHUNK = 1 << 16


class TraceFileError(RecprofError):
    """A trace file that cannot be read; the message starts with the file's path."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


_Time = Annotated[float, Meta(ge=-sanitize.MAX_ABS_TIME_US, le=sanitize.MAX_ABS_TIME_US)]
_Id = Annotated[int, Meta(ge=-sanitize.MAX_COUNT, le=sanitize.MAX_COUNT)]
_Text = Annotated[str, Meta(max_length=sanitize.MAX_NAME_CHARS)]


class TraceEvent(msgspec.Struct, gc=False):
    """An event object of `traceEvents`, with the fields the trace model reads. Each may hold
    any JSON value (sanitize.py decides what is usable); `args` is the raw JSON of the event's
    arguments, decoded by `RawTrace.args` for the few events whose arguments are read.
    `gc=False`: an event holds no cycles and need not be tracked."""

    ph: Any = None
    name: Any = None
    cat: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    args: msgspec.Raw = msgspec.Raw()


class CheckedEvent(msgspec.Struct, gc=False):
    """An event whose fields msgspec checked while decoding, as build.py would check them one
    by one: times finite numbers within sanitize's bounds (`dur` not negative), `name` and
    `cat` non-empty text (`name` at most MAX_NAME_CHARS), ids integers within MAX_COUNT or
    text of at most MAX_NAME_CHARS (Kineto's `"pid": "Spans"`).
    Nearly every event of a real trace is one; any field outside these (a string time, a
    float pid, a boolean) makes the event a `TraceEvent`, read field by field through
    sanitize. None stands for a missing field or a JSON null."""

    ph: Any = None
    name: Annotated[_Text, Meta(min_length=1)] | None = None
    cat: Annotated[str, Meta(min_length=1)] | None = None
    ts: _Time | None = None
    dur: Annotated[float, Meta(ge=0, le=sanitize.MAX_DURATION_US)] | None = None
    pid: _Id | _Text | None = None
    tid: _Id | _Text | None = None
    args: msgspec.Raw = msgspec.Raw()


class _Correlation(msgspec.Struct):
    """The one argument of a runtime call that is read."""

    correlation: Any = None


#: An element of `traceEvents`: an event object, or any other JSON value (skipped by build).
_Element = TraceEvent | list[Any] | str | int | float | bool | None
_CheckedElement = CheckedEvent | list[Any] | str | int | float | bool | None
#: `traceEvents` as found: a list of raw elements or anything else (refused below).
_Events = list[msgspec.Raw] | dict[str, Any] | str | int | float | bool | None


class _Document(msgspec.Struct):
    """A wrapped trace: its events and the top-level metadata build.py reads."""

    traceEvents: _Events | msgspec.UnsetType = msgspec.UNSET
    distributedInfo: Any | msgspec.UnsetType = msgspec.UNSET
    deviceProperties: Any | msgspec.UnsetType = msgspec.UNSET
    baseTimeNanoseconds: Any | msgspec.UnsetType = msgspec.UNSET
    host_name: Any | msgspec.UnsetType = msgspec.UNSET
    hip_runtime_version: Any | msgspec.UnsetType = msgspec.UNSET
    roctracer_version: Any | msgspec.UnsetType = msgspec.UNSET


_DOCUMENT = msgspec.json.Decoder(_Document | list[msgspec.Raw] | str | int | float | bool | None)
_ELEMENT = msgspec.json.Decoder(_Element)
_CHECKED_ELEMENT = msgspec.json.Decoder(_CheckedElement)
_CORRELATION = msgspec.json.Decoder(_Correlation)
_ANY = msgspec.json.Decoder()
_META_KEYS = tuple(k for k in _Document.__struct_fields__ if k != "traceEvents")
_JSON_ERRORS = (msgspec.DecodeError, RecursionError, UnicodeDecodeError)
_DEEPEST = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
#: The integers orjson reads as integers; it reads longer ones as floats.
_ORJSON_INTS = range(-(2**63), 2**64)


@dataclass
class RawTrace:
    """A file split into its events, still raw JSON, and the top-level metadata beside them
    (only the keys build.py reads; `hip_runtime_version` and `roctracer_version` count by
    presence). `data` is the file's text, which the raw events are slices of."""

    path: Path
    events: list[msgspec.Raw]
    meta: dict[str, Any] = field(default_factory=dict)
    data: bytes | bytearray | None = None

    def consume(self) -> Iterator[CheckedEvent | TraceEvent]:
        """Every event object (other elements are skipped), decoded one at a time, checked
        where it fits `CheckedEvent`, else loosely. One pass: the raw events and the file's
        text are released as it ends."""
        events, self.events = self.events, []
        decode = _CHECKED_ELEMENT.decode
        for element in events:
            try:
                event = decode(element)
            except _JSON_ERRORS:  # a field outside the checks, a deeper stack, or bad JSON
                event = self._decode(_ELEMENT, element)
            if type(event) is CheckedEvent or type(event) is TraceEvent:
                yield event
        del events
        self.data = None

    def elements(self, decoder: msgspec.json.Decoder) -> Iterator[Any]:
        """Every element decoded by `decoder` (a format with fields of its own: trace/ascend.py
        reads flow ids), one at a time; a value orjson refused fails the file as it did. One
        pass, like `consume`: the raw events and the file's text are released as it ends."""
        events, self.events = self.events, []
        for element in events:
            yield self._decode(decoder, element)
        del events
        self.data = None

    def scalar(self, value: Any) -> Any:
        """`value` as orjson read it, for a field that is not the common case: an integer
        beyond 64 bits is a float to orjson (msgspec keeps it whole), and one beyond float
        range fails the file as orjson failed it."""
        if type(value) is not int or value in _ORJSON_INTS:
            return value
        try:
            return float(value)
        except OverflowError as exc:
            problem = _json_problem(self.data, exc) if self.data is not None else str(exc)
            raise TraceFileError(self.path, f"invalid JSON ({problem})") from None

    def args(self, event: CheckedEvent | TraceEvent) -> Any:
        """The event's arguments as JSON values; None where it has none."""
        return self._decode(_ANY, event.args) if event.args else None

    def correlation(self, event: CheckedEvent | TraceEvent) -> Any:
        """The event's `correlation` argument, None where its arguments are not an object or
        lack it; the other arguments are skipped, not built."""
        if not event.args:
            return None
        try:
            return _CORRELATION.decode(event.args).correlation
        except msgspec.ValidationError:  # not an object: nothing to read
            return None
        except _JSON_ERRORS:  # a deeper stack, or the file fails
            return self._decode(_CORRELATION, event.args).correlation

    def _decode(self, decoder: msgspec.json.Decoder, raw: msgspec.Raw) -> Any:
        """`raw` decoded; a value orjson refused fails the file as it did. The document's
        decode bounded the nesting; only a fragment nested close to the bound needs the
        deeper stack."""
        try:
            try:
                return decoder.decode(raw)
            except RecursionError:
                return _decode_bounded(decoder, raw)
        except _JSON_ERRORS as exc:
            problem = _json_problem(self.data, exc) if self.data is not None else str(exc)
            raise TraceFileError(self.path, f"invalid JSON ({problem})") from None


def is_trace_file(path: Path) -> bool:
    return path.name.endswith(TRACE_SUFFIXES)


def read_bytes(path: Path, max_bytes: int = MAX_DECOMPRESSED_BYTES) -> bytes | bytearray:
    """The file's bytes, decompressed for `.gz`. Only regular files are opened: reading a
    FIFO or a device named `x.json` would block or never end. A `.gz` file is inflated a
    chunk at a time into one buffer, never holding the whole compressed file or a second
    copy of the inflated one. zlib-ng's gzip reader is the standard library's, inflating
    ~3x faster (0.24 vs 0.83 ms on a 0.6 MB rank, 86 vs 128 ms on 58 MB; docs/analysis.md,
    "Decoding")."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise TraceFileError(path, "not a regular file")
        if not path.name.endswith(".gz"):
            return path.read_bytes()
        with path.open("rb") as raw, gzip_ng.GzipFile(fileobj=raw) as fh:
            return _inflate(path, fh, max_bytes)
    except OSError as exc:
        if isinstance(exc, gzip_ng.BadGzipFile):
            raise TraceFileError(path, f"not a valid gzip file ({exc})") from None
        raise TraceFileError(path, f"cannot read ({exc.strerror or exc})") from None


def _inflate(path: Path, fh: gzip_ng.GzipFile, max_bytes: int) -> bytearray:
    out = bytearray()
    try:
        while chunk := fh.read(min(_GZIP_CHUNK, max_bytes + 1 - len(out))):
            out += chunk
            if len(out) > max_bytes:
                raise TraceFileError(path, f"decompresses to more than {max_bytes >> 20} MB; "
                                           "refused as a likely gzip bomb")
    except (OSError, EOFError, zlib_ng.error) as exc:
        raise TraceFileError(path, f"not a valid gzip file ({exc})") from None
    return out


def read_trace(path: Path) -> RawTrace:
    """Split a trace file into raw events; raise `TraceFileError` for anything that is not a
    Kineto trace."""
    data = read_bytes(path)
    if not data or data.isspace():
        raise TraceFileError(path, "file is empty")
    try:
        doc = _decode_bounded(_DOCUMENT, data)
    except _JSON_ERRORS as exc:
        raise TraceFileError(path, f"invalid JSON ({_json_problem(data, exc)})") from None
    if isinstance(doc, list):
        events, meta = doc, {}
    elif isinstance(doc, _Document):
        if doc.traceEvents is msgspec.UNSET:
            raise TraceFileError(path, "JSON has no 'traceEvents' key; not a Kineto trace")
        events = doc.traceEvents
        meta = {k: v for k in _META_KEYS if (v := getattr(doc, k)) is not msgspec.UNSET}
    else:
        raise TraceFileError(path, f"top-level JSON is a {type(doc).__name__}, not a trace")
    if not isinstance(events, list):
        raise TraceFileError(path, "'traceEvents' is not a list")
    if not events:
        raise TraceFileError(path, "trace holds no events")
    return RawTrace(path=path, events=events, meta=meta, data=data)


def _frame_depth() -> int:
    """How many Python frames are below the caller's (what its recursion limit must allow)."""
    frame, depth = sys._getframe(1), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def _recursion_limit_bounds_msgspec() -> bool:
    """Whether msgspec counts nesting on Python's recursion limit (CPython 3.11) rather than on
    the interpreter's own C-recursion limit, which `sys.setrecursionlimit` does not move
    (CPython 3.12 on). Measured once, not read from the version number: it is the behaviour of
    the running interpreter and msgspec build that matters."""
    old = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(_frame_depth() + 64)
        _ANY.decode(_DEEPEST)
        return False
    except RecursionError:
        return True
    finally:
        sys.setrecursionlimit(old)


#: False on CPython 3.12 and later: there nesting is refused where the interpreter's fixed
#: C-recursion limit refuses it (CPython 3.12.3 read 9,998 levels, refused 9,999), still as a
#: clear TraceFileError naming the file, but not at exactly MAX_JSON_DEPTH (docs/analysis.md).
_EXACT_NESTING_BOUND = _recursion_limit_bounds_msgspec()


def _decode_bounded(decoder: msgspec.json.Decoder, data: Any) -> Any:
    """`decoder.decode(data)`, nesting exactly MAX_JSON_DEPTH levels as orjson (and so every earlier
    recprof) did, where the interpreter lets us set that (_EXACT_NESTING_BOUND). msgspec counts
    nesting on Python's recursion limit, which would refuse ~990 levels here, fewer under a deep
    caller, and any depth a raised limit allows; so the limit is set, for this call, to the
    lowest at which MAX_JSON_DEPTH levels decode from this very frame, found by probes of 2 KB
    each. Found afresh every time: how much of the limit a call path uses changes as the
    interpreter specialises its calls, so a limit remembered from an earlier file was off by
    one. The search gallops up from the least possible limit (the answer is a few above it)
    before it bisects: 1 to 3 probes, where a bisection of the whole range took 11 (1.1 ms, a
    tenth of a small rank's analysis)."""
    if not _EXACT_NESTING_BOUND:
        return decoder.decode(data)
    old = sys.getrecursionlimit()
    depth = _frame_depth()
    lo, hi = depth + MAX_JSON_DEPTH, depth + 2 * MAX_JSON_DEPTH  # the answer is in [lo, hi]
    decoded, step = False, 1
    try:
        while lo < hi:
            probe = (lo + hi) // 2 if decoded else min(lo + step - 1, hi)
            step *= 2
            sys.setrecursionlimit(probe)
            try:
                _ANY.decode(_DEEPEST)
                decoded, hi = True, probe
            except RecursionError:
                lo = probe + 1
        sys.setrecursionlimit(min(lo, hi))
        return decoder.decode(data)
    finally:
        sys.setrecursionlimit(old)


def _json_problem(data: bytes | bytearray, exc: Exception) -> str:
    """What is wrong with the JSON, in orjson's words when orjson refuses it too (the words
    every earlier recprof printed: line and column, not msgspec's byte offset)."""
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError as reason:
        return str(reason)
    return str(exc)
