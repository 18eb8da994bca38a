"""The docs a user reads agree with the code and stay inside the repository.

Checked here, with no root and no network:

- every model `tailcut models` lists is in docs/models-and-sweeps.md and the README;
- no Markdown file a user is sent to (README.md, docs/**, bench/README.md,
  helm/README.md) links to a path outside the repository, or names the development
  machines' ../shared folder or PLATFORM.md, which users do not have;
- every relative link in those files reaches a file of the repository, and, when it
  names an anchor in a Markdown file, a heading of that file (GitHub's slugs);
- every `docs/<file>.md#anchor` that code or a bench script names resolves the same way.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tailcut.ml import models

ROOT = Path(__file__).resolve().parent.parent
USER_MARKDOWN = sorted([ROOT / "README.md", ROOT / "bench" / "README.md",
                        ROOT / "helm" / "README.md", *(ROOT / "docs").rglob("*.md")])

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
_CODE_DOC_REF = re.compile(r"docs/([\w./-]+\.md)#([\w-]+)")


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans (no links live there)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _links(path: Path) -> list[str]:
    return _LINK.findall(_prose(path.read_text()))


def _relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) and not target.startswith("#")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link's text only
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, heading in _HEADING.findall(_FENCE.sub("", path.read_text())):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("doc", ["docs/models-and-sweeps.md", "README.md"])
def test_every_model_tailcut_models_lists_is_in_the_doc(doc: str) -> None:
    text = (ROOT / doc).read_text()
    missing = [name for name in models.names()
               if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)]
    assert not missing, f"{doc} does not name the model(s) {missing} that `tailcut models` lists"


@pytest.mark.parametrize("path", USER_MARKDOWN, ids=_name)
def test_no_markdown_file_points_outside_the_repository(path: Path) -> None:
    text = path.read_text()
    for word in ("../shared", "PLATFORM.md"):
        assert word not in text, (
            f"{_name(path)} mentions {word!r}, which is not in the repository: "
            "say what the user needs to know in place")
    outside = [target for target in _links(path) if _relative(target)
               and not (path.parent / target.split("#")[0]).resolve().is_relative_to(ROOT)]
    assert not outside, f"{_name(path)} links outside the repository: {outside}"


@pytest.mark.parametrize("path", USER_MARKDOWN, ids=_name)
def test_every_relative_link_reaches_a_file_and_its_anchor(path: Path) -> None:
    broken = []
    for target in _links(path):
        if not _relative(target):
            if target.startswith("#") and target[1:] not in _anchors(path):
                broken.append(f"{target} (no such heading here)")
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve()
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading with that anchor in {_name(dest)})")
    assert not broken, f"{_name(path)}: broken links: {broken}"


def test_every_docs_anchor_named_in_code_resolves() -> None:
    broken = []
    for folder in ("tailcut", "bench", "operator", "workers", "scripts"):
        for source in sorted((ROOT / folder).rglob("*")):
            if source.suffix not in {".py", ".c", ".h", ".sh"} or not source.is_file():
                continue
            for file, anchor in _CODE_DOC_REF.findall(source.read_text(errors="replace")):
                doc = ROOT / "docs" / file
                if not doc.exists() or anchor not in _anchors(doc):
                    broken.append(f"{_name(source)}: docs/{file}#{anchor}")
    assert not broken, f"code names doc anchors that do not exist: {broken}"


def test_the_slugs_follow_github() -> None:
    assert _slug("Aggregation rules (`spec.training.aggregation`)") == \
        "aggregation-rules-spectrainingaggregation"
    assert _slug("On Kubernetes: the worker image with PyTorch") == \
        "on-kubernetes-the-worker-image-with-pytorch"
    assert _slug("2026-11-27: where a message's CPU goes, section by section") == \
        "2026-11-27-where-a-messages-cpu-goes-section-by-section"
