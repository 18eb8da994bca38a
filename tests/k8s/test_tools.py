"""tailcut.k8s.node.tools: the Kubernetes binaries are built the first time one is missing,
and only then; a failed build names the script and what is still missing."""

import pytest

from tailcut.k8s.node import tools


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty tools cache and, in place of scripts/k8s-tools.sh, a script that counts
    its runs and builds (touches) what $BUILDS names."""
    monkeypatch.setenv("TAILCUT_TOOLS", str(tmp_path / "cache"))
    script = tmp_path / "k8s-tools.sh"
    script.write_text('#!/bin/sh\necho run >> "$TAILCUT_TOOLS/runs"\n'
                      'bin="$TAILCUT_TOOLS/k8s-tools/bin"; mkdir -p "$bin"\n'
                      'for t in $BUILDS; do touch "$bin/$t"; done\n'
                      'echo "$bin"; exit ${EXIT:-0}\n')
    script.chmod(0o755)
    monkeypatch.setattr(tools, "SCRIPT", script)
    (tmp_path / "cache").mkdir()
    return tmp_path / "cache"


def runs(cache):
    path = cache / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_missing_binary_is_built_once_and_then_found_without_building(cache, monkeypatch):
    monkeypatch.setenv("BUILDS", " ".join(tools.ALL))
    said = []
    path = tools.binary("kubelet", progress=said.append)
    assert path == cache / "k8s-tools" / "bin" / "kubelet" and path.exists()
    assert runs(cache) == 1
    assert "kubelet not built yet" in said[0] and "k8s-tools.sh" in said[0]
    assert tools.binary("helm", progress=said.append).exists()
    assert runs(cache) == 1 and len(said) == 1


def test_a_build_that_leaves_a_binary_missing_names_it_and_the_script(cache, monkeypatch):
    monkeypatch.setenv("BUILDS", "helm")
    with pytest.raises(tools.ToolsError, match=r"exited 0 and kubelet is missing"):
        tools.ensure(["helm", "kubelet"], progress=lambda line: None)
    monkeypatch.setenv("EXIT", "3")
    with pytest.raises(tools.ToolsError, match=r"k8s-tools.sh exited 3"):
        tools.ensure(["kubelet"], progress=lambda line: None)


def test_without_the_script_the_error_says_where_to_build_them(cache, monkeypatch, tmp_path):
    monkeypatch.setattr(tools, "SCRIPT", tmp_path / "absent.sh")
    with pytest.raises(tools.ToolsError, match=r"kube-apiserver missing from .*k8s-tools.sh "
                                                r"from a tailcut checkout"):
        tools.binary("kube-apiserver")
