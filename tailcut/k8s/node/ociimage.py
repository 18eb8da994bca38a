"""Write a one-layer OCI image archive from a few files, without Docker or a registry;
and stream a docker-archive as an OCI archive that leaves out the layers a node has.

The node's containerd imports it as `kind load docker-image` would import a
`docker save`. Used for the images the node itself needs (the pod sandbox's pause
image), which are single static binaries. The archive is the OCI image layout:

    oci-layout                 {"imageLayoutVersion": "1.0.0"}
    index.json                 one manifest, named by io.containerd.image.name
    blobs/sha256/<digest>      the gzipped layer, the config, the manifest
"""

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Optional

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
PLAIN_LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"   # uncompressed


def _layer(files: dict[str, Path]) -> bytes:
    """An uncompressed tar of `files` (path in the image -> file here), root-owned,
    with fixed times so the same inputs give the same digest."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, source in sorted(files.items()):
            info = tarfile.TarInfo(name.lstrip("/"))
            data = source.read_bytes()
            info.size, info.mode, info.mtime = len(data), source.stat().st_mode & 0o7777, 0
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _blob(archive: tarfile.TarFile, data: bytes, media_type: str) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo("blobs/sha256/" + digest.split(":", 1)[1])
    info.size, info.mode = len(data), 0o644
    archive.addfile(info, io.BytesIO(data))
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def _add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    archive.addfile(info, io.BytesIO(data))


def write(path: Path, ref: str, files: dict[str, Path], entrypoint: list[str]) -> Path:
    """Write an OCI archive at `path` holding image `ref` (fully qualified, e.g.
    registry.k8s.io/pause:3.10: containerd names a bare one docker.io/...)."""
    layer = _layer(files)
    compressed = gzip.compress(layer, mtime=0)
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Entrypoint": entrypoint},
              "rootfs": {"type": "layers",
                         "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as archive:
        layer_desc = _blob(archive, compressed, LAYER_TYPE)
        config_desc = _blob(archive, json.dumps(config).encode(), CONFIG_TYPE)
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "config": config_desc,
                    "layers": [layer_desc]}
        manifest_desc = _blob(archive, json.dumps(manifest).encode(), MANIFEST_TYPE)
        manifest_desc["annotations"] = {"io.containerd.image.name": ref,
                                        "org.opencontainers.image.ref.name": ref}
        _add(archive, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _add(archive, "index.json", json.dumps({"schemaVersion": 2,
                                                "manifests": [manifest_desc]}).encode())
    tmp.replace(path)
    return path


@dataclass(frozen=True)
class DockerImage:
    """What a docker-archive of one image holds: its name, config and layers (member
    name in the archive, digest, size)."""
    ref: str
    config: bytes
    layers: list[tuple[str, str, int]]


def read_docker_archive(archive: Path) -> Optional[DockerImage]:
    """The image in docker-archive `archive` (what buildah and `docker save` write),
    or None if it is not one image whose layer files are named by their digests. Its
    layers are uncompressed tars, and the config lists their digests (diff_ids), so
    nothing needs hashing."""
    with tarfile.open(archive, "r:") as src:
        try:
            manifest = src.extractfile("manifest.json")
            entries = json.load(manifest) if manifest else []
            config_file = src.extractfile(entries[0]["Config"]) if len(entries) == 1 else None
            if config_file is None:
                return None
            config = config_file.read()
            diff_ids = json.loads(config)["rootfs"]["diff_ids"]
            names = entries[0]["Layers"]
            if [f"sha256:{n.removesuffix('.tar')}" for n in names] != diff_ids:
                return None
            return DockerImage(entries[0]["RepoTags"][0], config,
                               [(n, d, src.getmember(n).size) for n, d in zip(names, diff_ids)])
        except (KeyError, ValueError, TypeError, IndexError):
            return None


def stream_without(archive: Path, image: DockerImage, have: set[str],
                   out: IO[bytes]) -> None:
    """Write to `out` an OCI archive of `image` (read from `archive`) holding only the
    layers whose digest is not in `have`. A node's containerd that holds the rest
    unpacks the image from what it has: a change to tailcut's code sends only the
    code's layers, and an image sharing its first layers with one loaded before (the
    agent, the torch worker) only its own."""
    layers = [{"mediaType": PLAIN_LAYER_TYPE, "digest": digest, "size": size}
              for _, digest, size in image.layers]
    with tarfile.open(archive, "r:") as src, tarfile.open(fileobj=out, mode="w|") as dest:
        _add(dest, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        config_desc = _blob(dest, image.config, CONFIG_TYPE)
        for name, digest, size in image.layers:
            if digest not in have:
                info = tarfile.TarInfo("blobs/sha256/" + digest.split(":", 1)[1])
                info.size, info.mode = size, 0o644
                dest.addfile(info, src.extractfile(name))
        desc = _blob(dest, json.dumps({"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
                                       "config": config_desc, "layers": layers}).encode(),
                     MANIFEST_TYPE)
        desc["annotations"] = {"io.containerd.image.name": image.ref,
                               "org.opencontainers.image.ref.name": image.ref}
        _add(dest, "index.json", json.dumps({"schemaVersion": 2,
                                             "manifests": [desc]}).encode())
