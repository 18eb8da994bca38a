"""The four papers' own numbers: one YAML file per paper under ``data/``, each number with
the table, figure or section it is printed in. Code never holds a paper's number: the
sweep's paper columns, the simulator's headlines and `tailcut reproduce` read them here."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from tailcut.errors import SpecError

DATA_DIR = Path(__file__).with_name("data")
NAMES = ("apnet19", "cadentflow", "imc20", "mlfabric")
_ID = re.compile(r"^[a-z0-9][a-z0-9.\-]*$")


class PaperResult(BaseModel):
    """One number the paper prints."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    what: str     # the quantity and its setting, for a reader
    where: str    # "Table 3, p. 4": where the paper prints it
    paper: float
    unit: str
    why: str      # why ours may differ: the paper's setup against this testbed's

    @field_validator("id")
    @classmethod
    def _id_shape(cls, value: str) -> str:
        if not _ID.match(value):
            raise ValueError(f"{value!r}: use lowercase letters, digits, dots and dashes")
        return value


class Headline(BaseModel):
    """A claim the paper leads with, judged on one of its results: reproduced when ours
    goes the same way and is at least half its size (an `effect` of x - 1 for a speedup,
    x itself for an amount), from network-bound runs where `network` says ours comes
    from testbed runs."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str        # the result it is judged on
    claim: str     # in the paper's words
    condition: str  # the paper's condition for it
    effect: Literal["speedup", "amount"]
    network: bool  # ours comes from testbed runs, whose verdicts must be network-bound


class Paper(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    paper: str
    title: str
    venue: str
    source: str   # the name of its text, as the project's authors keep it
    results: list[PaperResult]
    headlines: list[Headline] = []

    @field_validator("results")
    @classmethod
    def _unique_ids(cls, value: list[PaperResult]) -> list[PaperResult]:
        seen: set[str] = set()
        for result in value:
            if result.id in seen:
                raise ValueError(f"result id {result.id!r} appears twice")
            seen.add(result.id)
        return value

    @model_validator(mode="after")
    def _headlines_name_results(self) -> "Paper":
        ids = {r.id for r in self.results}
        for headline in self.headlines:
            if headline.id not in ids:
                raise ValueError(f"headline {headline.id!r} names no result")
        return self

    def result(self, result_id: str) -> PaperResult:
        for result in self.results:
            if result.id == result_id:
                return result
        raise KeyError(f"{self.paper}: no result {result_id!r} in {self.paper}.yaml")


def path(name: str) -> Path:
    return DATA_DIR / f"{name}.yaml"


@functools.cache
def get(name: str) -> Paper:
    """The paper's checked-in data file (read once)."""
    return load(name)


def number(name: str, result_id: str) -> float | None:
    """One printed number, or None when the paper prints none under that id."""
    try:
        return get(name).result(result_id).paper
    except KeyError:
        return None


def load(name: str, source: Path | None = None) -> Paper:
    """The paper's data file, checked; a malformed file names the file and the field."""
    file = source or path(name)
    try:
        raw = yaml.safe_load(file.read_text())
        paper = Paper.model_validate(raw)
    except (OSError, yaml.YAMLError) as err:
        raise SpecError(f"{file}: {err}") from err
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise SpecError(f"{file}: {where}: {first['msg']}") from err
    if paper.paper != name:
        raise SpecError(f"{file}: paper: {paper.paper!r}, expected {name!r}")
    return paper
