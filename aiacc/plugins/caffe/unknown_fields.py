"""Fields of a .prototxt that aiacc's Caffe schema does not declare (a fork's `upsample_param { ... }`, a
known message's extra field, a fork's enum value), kept as text instead of refusing the file.

Caffe's forks add layer parameter messages under numbers that clash with each other, so no schema can
declare them all; OpenCV reads such files by skipping what its schema lacks. aiacc keeps them: each field of a
layer that the schema does not declare is cut out of the text and stored, verbatim, in the layer's
`aiacc_unknown_text` (a field of aiacc's own). An unknown field inside a known message (`kernel_sise` in a
`convolution_param`), or a layer field a letter off a declared one (`convolution_parm`), is taken for a typo and
stays a ParseError naming the line. The importer then keeps the layer opaque (or a
translator reads a fork message it knows from that text), OpenCV gets the layer whole, and `to_prototxt`
writes the text back where it was.
"""
from __future__ import annotations

import difflib
import re

from google.protobuf import text_format

from aiacc.plugins.caffe.schema import pb

_PLACEHOLDER = "AIACC_KEPT_{}"
_PLACEHOLDER_RE = re.compile(r'^([ \t]*)aiacc_unknown_text: "AIACC_KEPT_(\d+)"[ \t]*$', re.M)
_UNKNOWN = re.compile(r'has no field named "([^"]+)"')
_LAYER_BLOCKS = ("layer", "layers")
_LAYER_FIELDS = sorted(set(pb.LayerParameter.DESCRIPTOR.fields_by_name) | set(pb.V1LayerParameter.DESCRIPTOR.fields_by_name))


def _blocks(text: str) -> list[tuple[str, int, int, int]]:
    """(field name, offset of the name, offset of `{`, offset of `}`) of every message block of `text`,
    skipping strings and `#` comments."""
    out, stack, i, n = [], [], 0, len(text)
    last_name, last_start = "", -1
    while i < n:
        c = text[i]
        if c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if c in "\"'":
            i = _string_end(text, i)
            continue
        if c.isalpha() or c == "_" or c == "[":
            j = i + 1
            close = "]" if c == "[" else None
            while j < n and ((text[j] != close) if close else (text[j].isalnum() or text[j] in "_.")):
                j += 1
            j += 1 if close else 0
            last_name, last_start = text[i:j], i
            i = j
            continue
        if c == "{":
            stack.append((last_name, last_start, i))
        elif c == "}" and stack:
            name, start, open_ = stack.pop()
            out.append((name, start, open_, i))
        i += 1
    return out


def _string_end(text: str, i: int) -> int:
    q, j = text[i], i + 1
    while j < len(text) and text[j] != q and text[j] != "\n":
        j += 2 if text[j] == "\\" else 1
    return j + 1


def _skip_space(text: str, i: int) -> int:
    while i < len(text):
        if text[i].isspace():
            i += 1
        elif text[i] == "#":
            j = text.find("\n", i)
            i = len(text) if j < 0 else j
        else:
            break
    return i


def _field_end(text: str, start: int, blocks) -> int:
    """The offset just past the field whose name starts at `start` (a scalar, a list or a message)."""
    i = start
    while i < len(text) and (text[i].isalnum() or text[i] in "_.[]"):
        i += 1
    i = _skip_space(text, i)
    if i < len(text) and text[i] == ":":
        i = _skip_space(text, i + 1)
    if i < len(text) and text[i] == "{":
        close = next((c for _, _, o, c in blocks if o == i), None)
        return len(text) if close is None else close + 1
    if i < len(text) and text[i] == "[":
        j = i + 1
        while j < len(text) and text[j] != "]":
            j = _string_end(text, j) if text[j] in "\"'" else j + 1
        return j + 1
    if i < len(text) and text[i] in "\"'":
        end = i
        while i < len(text) and text[i] in "\"'":  # adjacent strings concatenate
            end = _string_end(text, i)
            i = _skip_space(text, end)
        return end
    while i < len(text) and not text[i].isspace() and text[i] not in "}{,;#":
        i += 1
    return i


def _offset(text: str, line: int, column: int) -> int:
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    return min(starts[line - 1] + max(column - 1, 0), len(text)) if 0 < line <= len(starts) else -1


def _cut(text: str, offset: int, name: str | None, kept: list[str]) -> str | None:
    """`text` with the layer field `name` at `offset` replaced by a placeholder (its text appended to `kept`),
    or None when it is not a field of a layer itself or looks like a typo of a declared one."""
    blocks = _blocks(text)
    chain = sorted((b for b in blocks if b[2] < offset <= b[3]), key=lambda b: b[2])
    if len(chain) != 1 or chain[0][0] not in _LAYER_BLOCKS or name is None:
        return None  # outside a layer, or inside a known message of one: an error as before
    if any(abs(len(f) - len(name)) <= 1 for f in difflib.get_close_matches(name, _LAYER_FIELDS, n=3, cutoff=0.85)):
        return None  # `convolution_parm`: a typo of a declared field (a letter off), not a fork's `roi_pooling_param`
    start = text.rfind(name, chain[0][2], offset + len(name))
    if start < 0:
        return None
    end = _field_end(text, start, blocks)
    if start < chain[0][2]:
        return None
    piece = text[start:end]
    kept.append(piece)
    # the same count of newlines keeps the line numbers of later errors right
    return text[:start] + f'aiacc_unknown_text: "{_PLACEHOLDER.format(len(kept) - 1)}"' + "\n" * piece.count("\n") \
        + text[end:]


def parse_keeping_unknown(text: str, message) -> list[str]:
    """Parse prototxt `text` into `message` (a NetParameter), keeping each layer's fields the schema does
    not know in its `aiacc_unknown_text`; returns the names of the fields kept. A syntax error, or an unknown
    field outside any layer, raises text_format.ParseError as the plain parser does."""
    kept: list[str] = []
    for _ in range(100000):
        try:
            text_format.Parse(text, message)
            break
        except text_format.ParseError as e:
            m = _UNKNOWN.search(str(e))
            if m is None or m.group(1) is None or not e.GetLine():
                raise
            cut = _cut(text, _offset(text, e.GetLine(), e.GetColumn()), m.group(1), kept)
            if cut is None:
                raise
            text = cut
            message.Clear()
    if not kept:
        return []
    for layer in list(message.layer) + list(message.layers):
        for i, entry in enumerate(layer.aiacc_unknown_text):
            if entry.startswith("AIACC_KEPT_"):
                layer.aiacc_unknown_text[i] = kept[int(entry[len("AIACC_KEPT_"):])]
    return [field_name(k) for k in kept]


def field_name(kept_text: str) -> str:
    """The field name a kept text starts with."""
    m = re.match(r"\s*(\[[^\]]*\]|[A-Za-z_][\w.]*)", kept_text)
    return m.group(1) if m else kept_text.strip()[:40]


def placeholder(k: int) -> str:
    """The string `to_prototxt` writes in place of the k-th kept text (then `restore` puts the text there)."""
    return _PLACEHOLDER.format(k)


def restore(text: str, kept: list[str]) -> str:
    """Prototxt text whose placeholder lines `aiacc_unknown_text: "AIACC_KEPT_<k>"` become kept[k]."""
    if not kept:
        return text
    return _PLACEHOLDER_RE.sub(lambda m: m.group(1) + kept[int(m.group(2))].strip(), text)
