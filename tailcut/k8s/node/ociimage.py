"""Write a one-layer OCI image archive from a few files, without Docker or a registry.

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
from pathlib import Path
from typing import Any

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"


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
