"""Print an image's pip requirements, one a line, from pyproject.toml alone: tailcut's
dependencies and the extras named, less the packages the image's code never imports.

    python3 scripts/image-requirements.py pyproject.toml --extra k8s --without matplotlib
    python3 scripts/image-requirements.py pyproject.toml --only locust
    python3 scripts/image-requirements.py pyproject.toml --extra k8s --extras-only

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


def requirements(project: dict[str, Any], extras: list[str], without: list[str],
                 only: list[str], extras_only: bool = False) -> list[str]:
    deps = [] if extras_only else list(project["dependencies"])
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"--extra {extra}: pyproject.toml has no such extra")
        deps += optional[extra]
    names = {name(d) for d in deps}
    for option, asked in (("--without", without), ("--only", only)):
        unknown = [a for a in asked if name(a) not in names]
        if unknown:
            raise SystemExit(f"{option} {', '.join(unknown)}: not a dependency (renamed?)")
    dropped, kept = {name(w) for w in without}, {name(o) for o in only}
    return [d for d in deps if name(d) not in dropped and (not kept or name(d) in kept)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyproject")
    parser.add_argument("--extra", action="append", default=[])
    parser.add_argument("--without", action="append", default=[])
    parser.add_argument("--only", action="append", default=[], help="just these")
    parser.add_argument("--extras-only", action="store_true",
                        help="the extras' requirements, not tailcut's own")
    args = parser.parse_args()
    with open(args.pyproject, "rb") as f:
        project = tomllib.load(f)["project"]
    sys.stdout.write("".join(f"{r}\n" for r in requirements(
        project, args.extra, args.without, args.only, args.extras_only)))


if __name__ == "__main__":
    main()
