"""A reader for the subset of the protobuf text format that Triton's ``config.pbtxt`` uses.

Fields are ``name: scalar``, ``name { ... }`` (or ``name: { ... }``, ``name < ... >``) and lists
``name: [ a, b ]`` (or ``name [ ... ]``) of scalars or messages; a field may repeat; ``#`` starts a
comment; separators ``,`` and ``;`` between fields are optional. Scalars are numbers, quoted strings
and identifiers (enum values, ``true``/``false``). No schema: the caller decides what each field
means. Every field keeps its line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from checker.errors import InputError, Problem
from checker.loading import MAX_DEPTH, check_size

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)[fF]?(?![A-Za-z_0-9]))
  | (?P<ident>-?[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[{}\[\]<>:,;])
""", re.VERBOSE)


class Ident(str):
    """An unquoted identifier: an enum value or true/false."""


@dataclass
class Field:
    name: str
    value: Any  # int | float | str | Ident | Message | list
    line: int


@dataclass
class Message:
    fields: list[Field] = field(default_factory=list)
    line: int = 1

    def all(self, name: str) -> list[Field]:
        return [f for f in self.fields if f.name == name]

    def names(self) -> list[str]:
        return [f.name for f in self.fields]


Value = int | float | str | Message | list


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


def _number(text: str) -> int | float:
    body = text.rstrip("fF") if not text.lower().startswith(("0x", "-0x", "+0x")) else text
    if re.fullmatch(r"[-+]?0[xX][0-9a-fA-F]+", body):
        return int(body, 16)
    if re.fullmatch(r"[-+]?\d+", body):
        return int(body)
    return float(body)


class _Parser:
    def __init__(self, text: str, source: str):
        self.source = source
        self.tokens: list[tuple[str, str, int]] = []
        line, pos = 1, 0
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None:
                raise self.error(line, text[pos:pos + 20].split("\n")[0], "protobuf text format")
            kind = match.lastgroup or ""
            value = match.group()
            if kind not in ("space", "comment"):
                self.tokens.append((kind, value, line))
            line += value.count("\n")
            pos = match.end()
        self.i = 0
        self.depth = 0  # messages and lists open (at most MAX_DEPTH: the parser recurses per level)

    def nested(self, line: int) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(line, "<too deeply nested>", f"nesting at most {MAX_DEPTH} levels deep (messages and lists)")

    def error(self, line: int | None, value: str, expected: str) -> InputError:
        return InputError(Problem("", value, expected, line), self.source)

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def next(self, what: str) -> tuple[str, str, int]:
        token = self.peek()
        if token is None:
            last = self.tokens[-1][2] if self.tokens else 1
            raise self.error(last, "<end of file>", what)
        self.i += 1
        return token

    def message(self, close: str | None, line: int) -> Message:
        self.nested(line)
        msg = Message(line=line)
        while True:
            token = self.peek()
            if token is None:
                if close is not None:
                    raise self.error(line, "<end of file>", f"'{close}' closing the message opened on line {line}")
                return msg
            kind, text, tline = token
            if kind == "punct" and text == close:
                self.i += 1
                self.depth -= 1
                return msg
            if kind == "punct" and text in ",;":
                self.i += 1
                continue
            if kind != "ident":
                raise self.error(tline, text, "a field name")
            self.i += 1
            msg.fields.append(Field(text, self.value(tline), tline))

    def value(self, line: int) -> Value:
        kind, text, tline = self.next("a value")
        if kind == "punct" and text == ":":
            kind, text, tline = self.next("a value")
            if kind == "punct" and text == "[":
                return self.list(tline)
        if kind == "punct" and text == "[":  # a repeated message field may omit the colon
            return self.list(tline)
        if kind == "punct" and text in "{<":
            return self.message("}" if text == "{" else ">", tline)
        return self.scalar(kind, text, tline)

    def scalar(self, kind: str, text: str, line: int) -> int | float | str:
        if kind == "number":
            return _number(text)
        if kind == "string":
            value = _unquote(text)
            while (nxt := self.peek()) is not None and nxt[0] == "string":  # adjacent strings concatenate
                self.i += 1
                value += _unquote(nxt[1])
            return value
        if kind == "ident":
            return Ident(text)
        raise self.error(line, text, "a number, a quoted string or an identifier")

    def list(self, line: int) -> list:
        self.nested(line)
        items: list = []
        while True:
            kind, text, tline = self.next(f"']' closing the list opened on line {line}")
            if kind == "punct" and text == "]":
                self.depth -= 1
                return items
            if kind == "punct" and text == ",":
                continue
            if kind == "punct" and text in "{<":
                items.append(self.message("}" if text == "{" else ">", tline))
            else:
                items.append(self.scalar(kind, text, tline))


def parse_pbtxt(text: str, source: str) -> Message:
    """Parse protobuf text within the input limits (size, nesting); raise InputError naming the file and line
    of the first problem."""
    check_size(text, source, "a config.pbtxt")
    return _Parser(text, source).message(None, 1)
