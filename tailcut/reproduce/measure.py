"""Our numbers, read back from the files the steps wrote, each with the file and key it
came from, so the report can say where every number lives."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional


@dataclass(frozen=True)
class Value:
    value: Optional[float]   # None: not measured (its step failed, or no counterpart here)
    source: str              # the file (relative to the paper's directory) and key
    note: str = ""           # e.g. ">= (no p failed: a lower bound)"
    verdicts: str = ""       # testbed runs behind it: their fidelity verdicts (`verdicts`)


def verdict(metrics: Optional[dict[str, Any]]) -> str:
    """A run's fidelity verdict from its metrics.json (docs/fidelity.md)."""
    return str(((metrics or {}).get("fidelity") or {}).get("verdict", "no verdict"))


def verdicts(runs: list[Optional[dict[str, Any]]]) -> str:
    """How many of `runs` (their metrics.json) had each verdict: "2 network-bound, 1
    marginal"; "—" for none."""
    found = [verdict(m) for m in runs if m]
    return ", ".join(f"{found.count(v)} {v}" for v in sorted(set(found))) or "—"


@dataclass(frozen=True)
class Figure:
    path: str                # relative to the paper's directory
    caption: str
    paper_label: str = ""    # the paper's figure it stands next to


@dataclass
class Measured:
    values: dict[str, Value] = field(default_factory=dict)     # by the paper's result id
    figures: list[Figure] = field(default_factory=list)
    tables: list[tuple[str, str]] = field(default_factory=list)  # title, Markdown table
    notes: list[str] = field(default_factory=list)              # what the reader should know


class Files:
    """Reads a paper's step outputs; every number it returns carries its source."""

    def __init__(self, paper_dir: Path) -> None:
        self.paper_dir = paper_dir

    def path(self, relative: str) -> Path:
        return self.paper_dir / relative

    def exists(self, relative: str) -> bool:
        return self.path(relative).exists()

    def rows(self, relative: str) -> list[dict[str, str]]:
        """A CSV's rows; none when the file is missing (its step failed)."""
        try:
            with open(self.path(relative), newline="") as f:
                return list(csv.DictReader(f))
        except OSError:
            return []

    def json(self, relative: str) -> Any:
        try:
            return json.loads(self.path(relative).read_text())
        except (OSError, ValueError):
            return None

    def csv_value(self, relative: str, match: dict[str, str], column: str,
                  note: str = "") -> Value:
        """The number in ``column`` of the first row whose fields equal ``match``."""
        where = ", ".join(f"{k}={v}" for k, v in match.items())
        source = f"{relative}: row {where}, column {column}"
        for row in self.rows(relative):
            if all(row.get(k) == v for k, v in match.items()):
                return Value(number(row.get(column)), source, note)
        return Value(None, source, "not in the file (its step failed or did not reach it)")

    def json_value(self, relative: str, key: str, note: str = "") -> Value:
        """The number at a dotted ``key`` ("a.b.0.c") of a JSON file."""
        source = f"{relative}: {key}"
        node = self.json(relative)
        for part in key.split("."):
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                return Value(None, source, "not in the file (its step failed or did not "
                                           "reach it)")
        return Value(number(node), source, note)


def number(text: Any) -> Optional[float]:
    """A finite float, or None for an empty or non-numeric cell."""
    if text is None or isinstance(text, bool):
        return None
    try:
        value = float(str(text).lstrip(">=").strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def ratio(numerator: Value, denominator: Value, how: str) -> Value:
    """numerator / denominator, None when either is missing or the denominator is 0."""
    a, b = numerator.value, denominator.value
    value = a / b if a is not None and b not in (None, 0.0) else None
    return Value(value, f"{how} = ({numerator.source}) / ({denominator.source})")


def markdown_table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """Rows as a Markdown table of the given columns."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    """Four significant digits for a float (CSV cells carry all 17)."""
    text = str(value)
    try:
        as_float = float(text)
    except ValueError:
        return text
    if text.lstrip("-").isdigit() or not math.isfinite(as_float):
        return text
    return f"{as_float:.4g}"
