"""Load a TrainingJob from YAML and turn validation failures into messages a person
can act on: each names the field (in YAML's camelCase) and what is wrong."""

import difflib
import re
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import pydantic
import yaml

from tailcut.errors import SpecError
from tailcut.spec.model import TrainingJob


def load_file(path: str | Path) -> TrainingJob:
    """Read and validate one TrainingJob YAML file."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise SpecError(f"{path}: cannot read: {err.strerror}") from err
    return load_text(text, source=str(path))


def load_text(text: str, source: str = "<text>") -> TrainingJob:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise SpecError(f"{source}: not valid YAML: {err}") from err
    if len(docs) != 1:
        raise SpecError(f"{source}: expected exactly one TrainingJob document, "
                        f"found {len(docs)}")
    return from_dict(docs[0], source)


def from_dict(data: Any, source: str = "<dict>", *,
              import_modules: bool = True) -> TrainingJob:
    """The TrainingJob of `data`. import_modules=False: a `training.module` is checked
    for its form only, never imported (the operator and the node agent: a tenant's
    code runs in the job's own pods, not in a privileged process)."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping with apiVersion, kind, metadata "
                        f"and spec, got {type(data).__name__}")
    try:
        return TrainingJob.model_validate(data, context={"import_modules": import_modules})
    except pydantic.ValidationError as err:
        lines = [describe(e) for e in err.errors()]
        raise SpecError(f"{source}: invalid TrainingJob:\n  " + "\n  ".join(lines)) from err


def field_path(loc: tuple[Any, ...]) -> str:
    """('spec', 'network', 'racks', 0, 'name') -> 'spec.network.racks[0].name'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def describe(error: Mapping[str, Any]) -> str:
    """One line for one pydantic error: 'field: what is wrong'."""
    loc = tuple(error["loc"])
    where = field_path(loc) or "(top level)"
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden":
        known = _known_fields(loc[:-1])
        hint = difflib.get_close_matches(str(loc[-1]), known, n=1)
        suggestion = f" (did you mean {hint[0]}?)" if hint else ""
        return f"{where}: unknown field{suggestion}; allowed: {', '.join(known)}"
    if kind == "missing":
        return f"{where}: required field is missing"
    if kind == "literal_error":
        return f"{where}={value!r}: {error['msg'].replace('Input should be', 'must be')}"
    if kind == "string_pattern_mismatch":
        return (f"{where}={value!r}: must be lower-case letters, digits and '-', starting "
                f"and ending with a letter or digit (pattern {error['ctx']['pattern']})")
    message = error["msg"].removeprefix("Value error, ")
    message = message.replace("Input should be", "must be")
    # Cross-field validators name the field they blame, relative to `where`.
    relative = _RELATIVE_FIELD.match(message) if kind == "value_error" else None
    if relative:
        return f"{where}.{relative.group(1)}: {relative.group(2)}"
    if isinstance(value, (dict, list)):
        return f"{where}: {message}"
    return f"{where}={value!r}: {message}"


_RELATIVE_FIELD = re.compile(r"^([A-Za-z][\w.\-\[\]]*): (.*)$", re.S)


def _known_fields(loc: tuple[Any, ...]) -> list[str]:
    """The YAML names of the fields allowed at `loc`, found by walking the models."""
    model: Any = TrainingJob
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = next((f for n, f in model.model_fields.items()
                      if (f.alias or n) == part or n == part), None)
        model = _inner_model(field.annotation) if field else None
    if model is None:
        return []
    return [f.alias or n for n, f in model.model_fields.items()]


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None
