"""One paper's report: report.md (a person opens it), comparison.csv and ours.json (the
numbers behind every row), next to the steps' own raw files."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from tailcut.reproduce import figures
from tailcut.reproduce.measure import Figure, Measured, Value
from tailcut.papers import Paper
from tailcut.reproduce.steps import Record, Step

COMPARISON_FIELDS = ("id", "what", "where", "unit", "paper", "ours", "ours_over_paper",
                     "note", "source")


def write(paper: Paper, measured: Measured, ran: Sequence[tuple[Step, Record]],
          environment: dict[str, Any], paper_dir: Path, invocation: str,
          quick: bool) -> Path:
    """Write the report and its data files into ``paper_dir``; return report.md's path."""
    rows = comparison(paper, measured)
    with open(paper_dir / "comparison.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COMPARISON_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    (paper_dir / "ours.json").write_text(json.dumps(
        {key: {"value": v.value, "source": v.source, "note": v.note}
         for key, v in measured.values.items()}, indent=2) + "\n")
    compared = [r for r in rows if r["ours_over_paper"] is not None]
    if compared:
        png = figures.ratios([r["id"] for r in compared],
                             [r["ours_over_paper"] for r in compared],
                             paper_dir / "ours_vs_paper.png",
                             f"{paper.paper}: each of our numbers over the paper's")
        measured.figures.insert(0, Figure(png.name, "Ours over the paper's, number by number"))
    claims = headlines(paper, measured)
    (paper_dir / "headlines.json").write_text(json.dumps(claims, indent=2) + "\n")
    text = markdown(paper, measured, rows, ran, environment, paper_dir, invocation, quick)
    text += headlines_markdown(claims)
    path = paper_dir / "report.md"
    path.write_text(text)
    return path


def comparison(paper: Paper, measured: Measured) -> list[dict[str, Any]]:
    """A row per number the paper prints: the paper's, ours, their ratio."""
    rows = []
    for result in paper.results:
        ours = measured.values.get(result.id, Value(None, "", "no counterpart on this testbed"))
        ratio = (ours.value / result.paper
                 if ours.value is not None and result.paper != 0 else None)
        rows.append({"id": result.id, "what": result.what, "where": result.where,
                     "unit": result.unit, "paper": result.paper, "ours": ours.value,
                     "ours_over_paper": None if ratio is None else round(ratio, 4),
                     "note": ours.note, "source": ours.source})
    return rows


REPRODUCED, NOT_REPRODUCED, NOT_MEASURED = "reproduced", "not reproduced", "not measured"


def judge_headline(effect: str, paper: float, ours: Optional[float], needs_network: bool,
                   verdicts: str) -> tuple[str, str]:
    """(status, why) of a headline: reproduced when ours goes the paper's way by at least
    half as much (x - 1 of a speedup, x of an amount) and, where it comes from testbed
    runs, every one of them was network-bound."""
    if ours is None:
        return NOT_MEASURED, "no counterpart was measured"
    shift = 1.0 if effect == "speedup" else 0.0   # a speedup's effect is x - 1
    theirs, mine = paper - shift, ours - shift
    if theirs * mine <= 0 or abs(mine) < abs(theirs) / 2:
        return NOT_REPRODUCED, (f"ours {fmt(ours)} against the paper's {fmt(paper)}: not in "
                                "its direction by half its size")
    if needs_network and (not verdicts or any(
            not part.strip().endswith("network-bound") for part in verdicts.split(","))):
        return NOT_REPRODUCED, (f"ours {fmt(ours)} goes the paper's way, but its runs were "
                                f"not all network-bound ({verdicts or 'no verdicts'})")
    return REPRODUCED, f"ours {fmt(ours)} against the paper's {fmt(paper)}"


def headlines(paper: Paper, measured: Measured) -> list[dict[str, Any]]:
    """The paper's leading claims, each with ours, its condition, its runs' verdicts
    and whether it was reproduced (headlines.json)."""
    out = []
    for headline in paper.headlines:
        result = paper.result(headline.id)
        ours = measured.values.get(headline.id, Value(None, ""))
        status, why = judge_headline(headline.effect, result.paper, ours.value,
                                     headline.network, ours.verdicts)
        if status != REPRODUCED:
            why += f". {result.why}"
        out.append({"id": headline.id, "claim": headline.claim, "paper": result.paper,
                    "unit": result.unit, "ours": ours.value, "paper_condition":
                    headline.condition, "our_condition": ours.note or ours.source,
                    "verdicts": ours.verdicts if headline.network else "not a testbed run",
                    "status": status, "why": why})
    return out


def headlines_markdown(claims: list[dict[str, Any]]) -> str:
    if not claims:
        return ""
    out = ["", "## Headlines", "",
           "| claim | paper | ours | the paper's condition | ours | runs' fidelity | "
           "status | why |", "|---|---:|---:|---|---|---|---|---|"]
    for c in claims:
        out.append(f"| {_cell(c['claim'])} | {fmt(c['paper'])} {_cell(c['unit'])} | "
                   f"{fmt(c['ours'])} | {_cell(c['paper_condition'])} | "
                   f"{_cell(c['our_condition'])} | {_cell(c['verdicts'] or '—')} | "
                   f"**{c['status']}** | {_cell(c['why'])} |")
    return "\n".join(out) + "\n"


def fmt(value: Optional[float]) -> str:
    """Three significant digits, no scientific notation for the usual magnitudes."""
    if value is None:
        return "—"
    if abs(value) < 1e-9:   # a tie computed in floating point (1 - 0.9999999999999999)
        return "0"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 0.01:
        return f"{value:.3g}"
    return f"{value:.2e}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(paper: Paper, measured: Measured, rows: list[dict[str, Any]],
             ran: Sequence[tuple[Step, Record]], environment: dict[str, Any],
             paper_dir: Path, invocation: str, quick: bool) -> str:
    """report.md: its sections in the order a reader wants them."""
    out = _intro_markdown(paper, rows, ran, environment, invocation, quick)
    out += _comparison_markdown(paper, rows)
    out += _notes_markdown(measured)
    out += _figures_markdown(measured, paper_dir)
    for title, table in measured.tables:
        out += ["", f"## {title}", "", table]
    out += _steps_markdown(ran)
    out += _raw_data_markdown(ran, paper_dir)
    out += _versions_markdown(environment)
    return "\n".join(out)


def _intro_markdown(paper: Paper, rows: list[dict[str, Any]],
                    ran: Sequence[tuple[Step, Record]], environment: dict[str, Any],
                    invocation: str, quick: bool) -> list[str]:
    """The title, how the report was made and how much of the paper it covers."""
    found = sum(1 for r in rows if r["ours"] is not None)
    out = [f"# Reproducing {paper.paper}: {paper.title} ({paper.venue})", ""]
    reused = sum(1 for _, record in ran if record.reused)
    out.append(f"`{invocation}` on {environment['host']}, {environment['date']}. "
               f"{found} of the paper's {len(rows)} numbers have a counterpart measured by "
               f"the steps below ({reused} of {len(ran)} reused from an earlier run into "
               f"this directory: see their commit and time). The paper's numbers are in "
               f"`paper.yaml` (copied from tailcut's data file). The last table says which "
               f"of its headlines were reproduced.")
    if quick:
        out += ["", "**`--quick`: a smoke run** (fewer models, seeds and epochs). Its "
                "numbers show the pipeline works; do not cite them."]
    return out


def _comparison_markdown(paper: Paper, rows: list[dict[str, Any]]) -> list[str]:
    """The paper's numbers next to ours, then the file each of ours was read from."""
    whys = {r.id: r.why for r in paper.results}
    out = ["", "## The paper's numbers next to ours", "",
           "| result | where in the paper | paper | ours | ours / paper | why they may differ |",
           "|---|---|---:|---:|---:|---|"]
    for row in rows:
        ours = fmt(row["ours"])
        if row["note"]:
            ours += f" ({row['note']})"
        ratio = fmt(row["ours_over_paper"])
        out.append(f"| {_cell(row['what'])} [`{row['id']}`] | {_cell(row['where'])} | "
                   f"{fmt(row['paper'])} {_cell(row['unit'])} | {_cell(ours)} | {ratio} | "
                   f"{_cell(whys[row['id']])} |")
    out += ["", "Every number of ours, and the file it was read from (relative to this "
            "report; `comparison.csv` and `ours.json` hold the same):", ""]
    for row in rows:
        if row["source"]:
            out.append(f"- `{row['id']}`: {row['source']}")
    return out


def _notes_markdown(measured: Measured) -> list[str]:
    """What to know when reading the numbers; nothing when there is nothing to know."""
    if not measured.notes:
        return []
    return ["", "## What to know when reading these numbers", "",
            *[f"- {note}" for note in measured.notes]]


def _figures_markdown(measured: Measured, paper_dir: Path) -> list[str]:
    """Every figure, or why it is missing (its step failed); nothing without figures."""
    if not measured.figures:
        return []
    out = ["", "## Figures", ""]
    for figure in measured.figures:
        label = f" (next to the paper's {figure.paper_label})" if figure.paper_label else ""
        present = (paper_dir / figure.path).exists()
        out += [f"### {figure.caption}{label}", ""]
        out.append(f"![{figure.caption}]({figure.path})" if present
                   else f"*not drawn: `{figure.path}` is missing (its step failed)*")
        out.append("")
    return out


def _steps_markdown(ran: Sequence[tuple[Step, Record]]) -> list[str]:
    """The steps' commands and how each ended, so a reader can run them again."""
    out = ["", "## Steps and commands", "",
           "Run from this directory; each step wrote into its own `steps/<name>/` "
           "(`log.txt` is its output, `step.json` how it ended). A second `tailcut "
           "reproduce` reuses the steps that finished.", "",
           "| step | what | command | exit | took | | finished | commit |",
           "|---|---|---|---:|---:|---|---|---|"]
    for step, record in ran:
        state = "reused" if record.reused else ("ran" if record.ok else "**failed**")
        out.append(f"| {step.name} | {_cell(step.title)} | `{_cell(record.command)}` | "
                   f"{record.exit_code} | {record.seconds:.0f} s | {state} | "
                   f"{record.finished} | {record.commit or '?'} |")
    return out


def _raw_data_markdown(ran: Sequence[tuple[Step, Record]], paper_dir: Path) -> list[str]:
    """Links to each step's CSV and JSON files (the first 40: a step may write many)."""
    out = ["", "## Raw data", ""]
    for step, _ in ran:
        files = sorted(p for p in (paper_dir / "steps" / step.name).rglob("*")
                       if p.suffix in (".csv", ".json") and p.is_file())
        listed = ", ".join(f"[`{p.relative_to(paper_dir)}`]({p.relative_to(paper_dir)})"
                           for p in files[:40])
        more = f" and {len(files) - 40} more" if len(files) > 40 else ""
        out.append(f"- {step.name}: {listed or 'none'}{more}")
    return out


def _versions_markdown(environment: dict[str, Any]) -> list[str]:
    """The software and the machine the numbers came from."""
    versions = environment["versions"]
    return ["", "## Versions and machine", "",
            f"- tailcut {versions.get('tailcut')} (commit {environment['git_commit']}), "
            f"Python {versions['python']}, "
            + ", ".join(f"{k} {v}" for k, v in versions.items()
                        if k not in ("tailcut", "python")),
            f"- kernel {environment['kernel']} ({environment['machine']}), "
            f"{environment['cpus']} CPUs, {environment['memory_gib']} GiB, load average "
            f"{' / '.join(str(x) for x in environment['load_average'])} when it started",
            "- `tailcut doctor` (what this kernel supports; `../environment/doctor.txt`):",
            "", "```", environment.get("doctor", "").rstrip(), "```", ""]
