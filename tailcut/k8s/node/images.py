"""Build tailcut's three images (and, asked, the worker with PyTorch) from their
Dockerfiles without Docker or a registry.

    archives = images.build_all()        # name -> docker-archive tarball, cached
    cluster.load_image(archives["worker"])

`buildah bud` builds operator/Dockerfile, operator/agent.Dockerfile and
workers/Dockerfile exactly as `docker build` would, with `--build-arg BASE=` a Debian 12
base made here by mmdebstrap (no registry holds python:3.11-slim for these machines).
The base carries this machine's own package-client settings (apt sources, /etc/pip.conf,
extra CA certificates), so `apt-get` and `pip` inside the Dockerfiles reach the package
registries as they do on the host. Each image is saved as a docker-archive (what
`docker save` writes and `kind load docker-image` loads), named by a hash of its
Dockerfile and build context, so it is rebuilt only when those change. Buildah's
storage lives under the cache directory; nothing global is touched.
"""

import hashlib
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

from tailcut.errors import TailcutError
from tailcut.k8s.node import devcluster

REPO = Path(__file__).resolve().parents[3]
REGISTRY = "ghcr.io/tailcut"
TAG = "0.1.0"
BASE_NAME = "localhost/tailcut/debian-base"
BASE_PACKAGES = ["python3", "python3-venv", "ca-certificates"]
# name -> (Dockerfile, what it copies from the repository): the dependencies' layer
# reads pyproject.toml through scripts/image-requirements.py, the code's layers copy
# tailcut/, ebpf/ and the image's entry point.
DEPENDENCIES = ["pyproject.toml", "scripts/image-requirements.py"]
CODE = ["tailcut", "ebpf"]
IMAGES = {
    "worker": ("workers/Dockerfile", [*DEPENDENCIES, *CODE, "workers/entrypoint.py"]),
    "operator": ("operator/Dockerfile", [*DEPENDENCIES, *CODE, "operator/handlers.py"]),
    "agent": ("operator/agent.Dockerfile", [*DEPENDENCIES, *CODE]),
    "worker-torch": ("workers/torch.Dockerfile",
                     [*DEPENDENCIES, *CODE, "workers/entrypoint.py"]),
}
# Built only on request (`tailcut images build --torch`): PyTorch adds about 650 MiB,
# which only jobs with a torch model or `syncMode: allreduce` need.
ON_REQUEST = ("worker-torch",)
DEFAULT = [name for name in IMAGES if name not in ON_REQUEST]
# Left out of the base: manuals, documentation and translations (dpkg's path-exclude,
# kept in the base so the Dockerfiles' apt-get honours it too), and apt's caches, as
# Debian's own container images do.
BASE_EXCLUDE = ["/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*",
                "/usr/share/locale/*", "/usr/share/doc-base/*"]
APT_NO_CACHE = ('Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache ""; DPkg::Post-Invoke '
                '{ "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb '
                '|| true"; };')
Progress = Callable[[str], None]


class ImageError(TailcutError):
    """An image could not be built; the message names the image and the step."""


def ref(name: str) -> str:
    return f"{REGISTRY}/{name}:{TAG}"


def cache_dir() -> Path:
    return devcluster.tools_dir().parent / "images"


def _buildah(*args: str, timeout_s: float = 1800) -> subprocess.CompletedProcess[str]:
    if shutil.which("buildah") is None:
        raise ImageError("buildah is missing: apt-get install buildah (scripts/setup.sh "
                         "--cluster installs it)")
    storage = cache_dir() / "storage"
    return subprocess.run(["buildah", "--root", str(storage), "--runroot",
                           str(cache_dir() / "run"), "--storage-driver", "overlay", *args],
                          capture_output=True, text=True, timeout=timeout_s)


def context_hash(dockerfile: str, paths: list[str], extra: str = "") -> str:
    """A hash of the Dockerfile, the files it copies and `extra` (the base's id)."""
    digest = hashlib.sha256(extra.encode())
    files: list[Path] = [REPO / dockerfile]
    for rel in paths:
        path = REPO / rel
        files += sorted(p for p in path.rglob("*") if p.is_file()
                        and "__pycache__" not in p.parts) if path.is_dir() else [path]
    for path in files:
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _apt_mirror() -> str:
    """The Debian mirror apt uses here (deb822 sources or sources.list)."""
    for source in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        match = re.search(r"^URIs:\s*(\S+)", source.read_text(), re.MULTILINE)
        if match and "security" not in match.group(1):
            return match.group(1)
    listing = Path("/etc/apt/sources.list")
    if listing.exists():
        match = re.search(r"^deb\s+(\S+)\s+bookworm\s", listing.read_text(), re.MULTILINE)
        if match:
            return match.group(1)
    raise ImageError("base: no Debian mirror found in /etc/apt/sources.list{,.d}")


def _mmdebstrap_argv() -> list[str]:
    """How the base is made, less the mirror and the output (which name no content)."""
    hooks = [
        # The host's extra CAs (an egress proxy's) and pip settings, so pip inside the
        # image reaches PyPI as it does here.
        'mkdir -p "$1/usr/local/share/ca-certificates"',
        'cp -a /usr/local/share/ca-certificates/. "$1/usr/local/share/ca-certificates/" '
        '2>/dev/null || true',
        'chroot "$1" update-ca-certificates >/dev/null',
        '[ -f /etc/pip.conf ] && cp /etc/pip.conf "$1/etc/pip.conf" || true',
        # after it, apt no longer knows the caches' names: remove them here
        f"echo '{APT_NO_CACHE}' > \"$1/etc/apt/apt.conf.d/docker-clean\"",
        'rm -f "$1"/var/cache/apt/*.bin',
    ]
    argv = ["mmdebstrap", "--quiet", "--variant=minbase",
            "--include=" + ",".join(BASE_PACKAGES),
            # keep the copyright files: their licences go where the software goes
            *[f"--dpkgopt=path-exclude={p}" for p in BASE_EXCLUDE],
            "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            "--dpkgopt=path-include=/usr/share/locale/locale.alias"]
    for hook in hooks:
        argv += ["--customize-hook", hook]
    return argv


def base_ref() -> str:
    """The base's name, which changes with how it is made (so a new recipe is used)."""
    recipe = hashlib.sha256("\0".join(_mmdebstrap_argv()).encode()).hexdigest()[:12]
    return f"{BASE_NAME}:bookworm-{recipe}"


def build_base(progress: Progress = print) -> str:
    """The Debian 12 base in buildah's storage (made once); its image id."""
    existing = _buildah("images", "--quiet", "--no-trunc", base_ref())
    if existing.returncode == 0 and existing.stdout.strip():
        return existing.stdout.split()[0]
    if shutil.which("mmdebstrap") is None:
        raise ImageError("mmdebstrap is missing: apt-get install mmdebstrap "
                         "(scripts/setup.sh --cluster installs it)")
    cache_dir().mkdir(parents=True, exist_ok=True)
    rootfs = cache_dir() / "debian-base.tar"
    progress(f"base: mmdebstrap bookworm ({', '.join(BASE_PACKAGES)})")
    out = subprocess.run([*_mmdebstrap_argv(), "bookworm", str(rootfs),
                          f"deb {_apt_mirror()} bookworm main"],
                         capture_output=True, text=True, timeout=1200)
    if out.returncode != 0:
        raise ImageError(f"base: mmdebstrap failed: {out.stderr.strip()[-2000:]}")
    container = _checked(_buildah("from", "scratch"), "base: buildah from").strip()
    try:
        _checked(_buildah("add", container, str(rootfs), "/"), "base: buildah add")
        _checked(_buildah("config", "--env",
                          "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                          "--cmd", "/bin/bash", container), "base: buildah config")
        _checked(_buildah("commit", "--quiet", container, base_ref()), "base: buildah commit")
    finally:
        _buildah("rm", container)
        rootfs.unlink(missing_ok=True)
    return build_base(progress)


def build(name: str, base_id: str, force: bool = False, progress: Progress = print) -> Path:
    """Build image `name` from its Dockerfile (if its inputs changed); the archive."""
    dockerfile, paths = IMAGES[name]
    archive = cache_dir() / f"{name}-{context_hash(dockerfile, paths, base_id)}.tar"
    if archive.exists() and not force:
        progress(f"{name}: cached ({archive.name})")
        return archive
    progress(f"{name}: buildah bud -f {dockerfile}")
    started = time.monotonic()
    # --layers: every step's result is kept, so an unchanged step (Debian's packages,
    # the Python dependencies) is reused and a change to the code runs only the last.
    out = _buildah("bud", "--isolation", "chroot", "--layers", "-f", str(REPO / dockerfile),
                   "--build-arg", f"BASE={base_ref()}", "-t", ref(name), str(REPO))
    if out.returncode != 0:
        raise ImageError(f"{name}: building {dockerfile} failed:\n"
                         + "\n".join((out.stdout + out.stderr).splitlines()[-30:]))
    built = time.monotonic()
    for old in cache_dir().glob(f"{name}-*.tar"):   # not worker-torch's for worker
        if re.fullmatch(rf"{re.escape(name)}-[0-9a-f]{{16}}\.tar", old.name):
            old.unlink()
    tmp = archive.with_suffix(".part")
    tmp.unlink(missing_ok=True)
    _checked(_buildah("push", "--quiet", ref(name), f"docker-archive:{tmp}:{ref(name)}"),
             f"{name}: saving the archive")
    tmp.replace(archive)
    progress(f"{name}: built in {time.monotonic() - started:.0f} s (buildah bud "
             f"{built - started:.0f} s, the archive {time.monotonic() - built:.0f} s; {archive})")
    return archive


def build_all(force: bool = False, progress: Progress = print,
              names: Optional[list[str]] = None, torch: bool = False) -> dict[str, Path]:
    """`names` (default: the three, and the torch worker if `torch`), each built if
    its inputs changed; name -> archive."""
    base_id = build_base(progress)
    wanted = names or DEFAULT + (list(ON_REQUEST) if torch else [])
    # Two at a time: the agent and the torch worker after the worker, whose first
    # layers they reuse (built at once, each would make its own copy, which a node
    # then stores twice); the operator meanwhile.
    family = ("worker", "agent", "worker-torch")
    chains: list[list[str]] = [[n for n in family if n in wanted],
                               [n for n in wanted if n not in family]]

    def run(chain: list[str]) -> dict[str, Path]:
        return {name: build(name, base_id, force, progress) for name in chain}

    built: dict[str, Path] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for done in [pool.submit(run, chain) for chain in chains if chain]:
            built.update(done.result())
    return {name: built[name] for name in wanted}


def _checked(out: subprocess.CompletedProcess[str], what: str) -> str:
    if out.returncode != 0:
        raise ImageError(f"{what}: {out.stderr.strip()[-2000:]}")
    return out.stdout
