"""Print an image's pip requirements, one a line, from pyproject.toml alone: tailcut's
dependencies and the extras named, less the packages the image's code never imports.

    python3 scripts/image-requirements.py pyproject.toml --extra k8s --without matplotlib

The Dockerfiles install these in a layer of their own, before they copy tailcut's code,
so a change to the code rebuilds only the code's layer. tests/k8s/test_images.py checks
that no module an image runs imports what `--without` leaves out.
"""

import argparse
import re
import sys
import tomllib
from typing import Any


def name(requirement: str) -> str:
    """The normalised distribution name of a requirement ("PyYAML>=6" -> "pyyaml")."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def requirements(project: dict[str, Any], extras: list[str], without: list[str]) -> list[str]:
    deps = list(project["dependencies"])
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"--extra {extra}: pyproject.toml has no such extra")
        deps += optional[extra]
    names = {name(d) for d in deps}
    unknown = [w for w in without if name(w) not in names]
    if unknown:
        raise SystemExit(f"--without {', '.join(unknown)}: not a dependency (renamed?)")
    dropped = {name(w) for w in without}
    return [d for d in deps if name(d) not in dropped]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyproject")
    parser.add_argument("--extra", action="append", default=[])
    parser.add_argument("--without", action="append", default=[])
    args = parser.parse_args()
    with open(args.pyproject, "rb") as f:
        project = tomllib.load(f)["project"]
    sys.stdout.write("".join(f"{r}\n" for r in requirements(project, args.extra,
                                                              args.without)))


if __name__ == "__main__":
    main()
