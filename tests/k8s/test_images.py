"""The images' Dockerfiles: dependencies before code, and no module an image runs
imports a package its Dockerfile leaves out (a static check over every import
statement, those inside functions too, so it cannot miss a lazy import)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tailcut.k8s.node import images
from tailcut.transports import rxfast

REPO = Path(__file__).resolve().parents[2]
# What each image runs: its entry point, and the modules its pods start with `-m`.
RUNS = {
    "worker": ["workers/entrypoint.py", "tailcut.background.pod", "tailcut.background.server",
               "tailcut.background.locustfile"],
    "operator": ["operator/handlers.py"],
    "agent": ["tailcut.k8s.agent.__main__"],   # what `python -m tailcut.k8s.agent` runs
}
RUNS["worker-torch"] = RUNS["worker"]
# distribution -> the top-level modules it provides (and those only it brings)
MODULES = {"matplotlib": {"matplotlib", "mpl_toolkits"}, "locust": {"locust", "gevent"}}


def _source(module: str) -> Path | None:
    path = REPO.joinpath(*module.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path, module: str) -> set[str]:
    """Every module an import statement of `path` names, wherever the statement is."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def third_party(entries: list[str]) -> set[str]:
    """The top-level modules outside tailcut that the entries can reach."""
    return {name.split(".")[0] for name in outside_modules(entries)}


def outside_modules(entries: list[str]) -> set[str]:
    """The modules outside tailcut, by their full names, that the entries can reach."""
    todo = [(e, REPO / e) if e.endswith(".py") else (e, _source(e)) for e in entries]
    seen: set[str] = set()
    outside: set[str] = set()
    while todo:
        module, path = todo.pop()
        if module in seen or path is None:
            continue
        seen.add(module)
        for name in _imports(path, module):
            if name.split(".")[0] != "tailcut":
                outside.add(name)
                continue
            parts = name.split(".")
            todo += [(".".join(parts[:i]), _source(".".join(parts[:i])))
                     for i in range(1, len(parts) + 1)]
    return outside


def left_out(dockerfile: str) -> set[str]:
    """What one step leaves out (--without) and no later step adds (--only)."""
    text = (REPO / dockerfile).read_text()
    return set(re.findall(r"--without (\S+)", text)) - set(re.findall(r"--only (\S+)", text))


def steps(dockerfile: str, stage: str = "final") -> list[str]:
    """The steps of the image (its last stage), or of the build stage named ``stage``."""
    text = (REPO / dockerfile).read_text().replace("\\\n", " ")   # join continued lines
    lines = [line for line in text.splitlines()
             if line.startswith(("ARG", "FROM", "COPY", "RUN"))]
    froms = [i for i, line in enumerate(lines) if line.startswith("FROM")]
    if stage == "final":
        return lines[:froms[0]] + lines[froms[-1]:]
    start = next(i for i in froms if lines[i].endswith(f" AS {stage}"))
    end = next((i for i in froms if i > start), len(lines))
    return lines[start:end]


@pytest.mark.parametrize("name", sorted(images.IMAGES))
def test_no_module_an_image_runs_imports_what_its_dockerfile_leaves_out(name):
    dockerfile, _ = images.IMAGES[name]
    dropped = left_out(dockerfile)
    assert dropped, f"{dockerfile} leaves nothing out"
    reached = third_party(RUNS[name])
    assert "pydantic" in reached and "numpy" in reached   # the scan does follow imports
    for distribution in dropped:
        assert not MODULES[distribution] & reached, (name, distribution)


def test_the_scan_finds_a_lazy_import_inside_a_function():
    assert "matplotlib" in third_party(["tailcut.reports"]) | third_party(
        ["tailcut.reports.plots"])
    assert {"locust", "gevent"} <= third_party(RUNS["worker"])


@pytest.mark.parametrize("name", sorted(images.IMAGES))
def test_each_dockerfile_copies_the_code_after_installing_the_dependencies(name):
    dockerfile, copied = images.IMAGES[name]
    lines = [line for line in steps(dockerfile) if line.startswith(("COPY", "RUN"))]
    pip = next(i for i, line in enumerate(lines) if "pip install" in line)
    code = next(i for i, line in enumerate(lines) if line.startswith("COPY tailcut"))
    assert pip < code
    # what the cache key hashes is what the Dockerfile copies, in any of its stages
    text = (REPO / dockerfile).read_text().replace("\\\n", " ")
    sources = {part for line in text.splitlines() if line.startswith("COPY ")
               and "--from=" not in line for part in line.split()[1:-1]}
    assert {s for s in sources if not any(s == c or s.startswith(c + "/") for c in copied)} \
        == set()
    assert {c for c in copied if not any(s == c or s.startswith(c + "/") for s in sources)} \
        == set()


@pytest.mark.parametrize("name", ["worker", "worker-torch"])
def test_the_worker_images_carry_the_compiled_datagram_paths_and_no_compiler(name):
    dockerfile, _ = images.IMAGES[name]
    build, final = steps(dockerfile, "rxfast"), steps(dockerfile)
    assert any("gcc" in line for line in build) and not any("gcc" in line for line in final)
    assert any(line.startswith("COPY --from=rxfast") and "/usr/local/lib/tailcut/rxfast.so"
               in line for line in final)
    text = (REPO / dockerfile).read_text()
    assert "TAILCUT_RXFAST_LIB=/usr/local/lib/tailcut/rxfast.so" in text
    # compiled as rxfast.py compiles it
    [cc] = [line for line in build if line.startswith("RUN cc ")]
    assert cc.split()[2:2 + len(rxfast.CFLAGS)] == list(rxfast.CFLAGS)
    assert [f"/src/{source.name}" for source in rxfast.SOURCES] == cc.split()[-len(rxfast.SOURCES):]


def test_image_requirements_drop_what_is_asked_and_refuse_a_name_that_is_not_there():
    script = [sys.executable, str(REPO / "scripts" / "image-requirements.py"),
              str(REPO / "pyproject.toml")]
    out = subprocess.run([*script, "--extra", "k8s", "--without", "matplotlib"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert any(r.startswith("numpy") for r in out) and any(r.startswith("kopf") for r in out)
    assert not any(r.lower().startswith("matplotlib") for r in out)
    bad = subprocess.run([*script, "--without", "matplotlb"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--without matplotlb: not a dependency" in bad.stderr


def test_the_worker_and_the_agent_share_their_packages_and_core_dependencies():
    """Same steps on the same base make the same layers, which a node stores once."""
    worker, agent = steps("workers/Dockerfile"), steps("operator/agent.Dockerfile")
    shared = next(i for i, line in enumerate(worker) if "pip install" in line) + 1
    assert worker[:shared] == agent[:shared]
    assert "python3-bpfcc" in worker[2] and "nftables" in worker[2]


def test_the_torch_worker_is_the_worker_with_pytorch_before_the_code():
    """Its every step is the worker's (so a node stores those layers once, and a change
    to the code leaves PyTorch's layer alone), with one more: PyTorch's, before the
    code is copied."""
    worker, torch = steps("workers/Dockerfile"), steps("workers/torch.Dockerfile")
    [extra] = [line for line in torch if line not in worker]
    assert "python3-torch" in extra and "libopenblas0-pthread" in extra
    assert [line for line in torch if line != extra] == worker
    assert torch.index(extra) < torch.index("COPY tailcut /app/tailcut")
    assert "worker-torch" not in images.DEFAULT   # built on request only


def test_no_module_the_operator_or_the_agent_runs_imports_the_asyncio_client():
    """Their Dockerfiles delete kubernetes/aio, the client's asyncio copy."""
    for name in ("operator", "agent"):
        dockerfile, _ = images.IMAGES[name]
        assert "kubernetes/aio" in (REPO / dockerfile).read_text()
        reached = outside_modules(RUNS[name])
        assert "kubernetes" in reached or any(m.startswith("kubernetes.") for m in reached)
        assert not any(m == "kubernetes.aio" or m.startswith("kubernetes.aio.")
                       for m in reached), name
