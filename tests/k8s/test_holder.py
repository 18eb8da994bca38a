"""The holder keeps a namespace alive after its name is gone, hands it back to a new
agent, refuses what it should, and stops when its pod goes (tailcut/k8s/agent/holder.py):
a real holder process and real network namespaces."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tailcut.k8s.agent import holder
from tailcut.net import netns
from tests import waiting

NAME = "tck8s-hold.test@n1.spine"


@pytest.fixture
def running_holder(tmp_path):
    path = str(tmp_path / "holder.sock")
    proc = subprocess.Popen([sys.executable, "-m", "tailcut.k8s.agent.holder", path],
                            stderr=subprocess.PIPE, text=True)
    assert waiting.until(lambda: os.path.exists(path), within_s=10, every_s=0.05)
    yield proc, path
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture
def namespace_with_a_link():
    netns.create(NAME)
    try:
        subprocess.run(["ip", "-n", NAME, "link", "add", "kept0", "type", "veth",
                        "peer", "name", "kept1"], check=True)
        yield
    finally:
        if netns.exists(NAME):
            netns.remove(NAME)


def links_in(fd):
    """The link names of the namespace open as `fd` (entered by a child)."""
    out = subprocess.run(["nsenter", f"--net=/proc/{os.getpid()}/fd/{fd}", "ip", "-o",
                          "link"], capture_output=True, text=True, check=True, pass_fds=(fd,))
    return [line.split(":")[1].strip().split("@")[0] for line in out.stdout.splitlines()]


@pytest.mark.netns
def test_a_held_namespace_outlives_its_name_and_comes_back_to_a_new_client(
        running_holder, namespace_with_a_link):
    _, path = running_holder
    holder.Client(path).hold(NAME, netns.path(NAME), "uid-1:abc")
    inode = os.stat(netns.path(NAME)).st_ino
    netns.remove(NAME)   # the agent's name goes with its mount namespace
    successor = holder.Client(path)
    [(name, kept)] = successor.held().items()
    try:
        assert name == NAME and kept.tag == "uid-1:abc"
        assert os.fstat(kept.fd).st_ino == inode, "not the same namespace"
        assert "kept0" in links_in(kept.fd), "the namespace lost its link"
    finally:
        os.close(kept.fd)
    successor.drop(NAME)
    assert successor.held() == {}


@pytest.mark.netns
def test_bad_requests_are_refused_by_name_and_the_connection_stays_usable(
        running_holder, namespace_with_a_link):
    _, path = running_holder
    client = holder.Client(path)
    for bad in ("../../etc", "a/b", "", "x" * 201):
        with pytest.raises(holder.HolderError, match="not a namespace name"):
            client.hold(bad, netns.path(NAME), "t")
    with pytest.raises(holder.HolderError, match="not a tag"):
        client.hold(NAME, netns.path(NAME), "x;y")
    with pytest.raises(holder.HolderError, match="0 descriptors"):
        client._ask(f"HOLD {NAME} t")
    with pytest.raises(holder.HolderError, match="unknown request"):
        client._ask("GIVE everything")
    assert client.stopping() is False and client.held() == {}


def test_a_client_without_a_holder_says_where_it_looked(tmp_path):
    with pytest.raises(holder.HolderError, match="cannot reach the holder at .*nowhere"):
        holder.Client(str(tmp_path / "nowhere")).stopping()


@pytest.mark.netns
def test_sigterm_makes_it_say_stopping_and_it_exits_once_the_agent_dropped_all(
        running_holder, namespace_with_a_link):
    proc, path = running_holder
    client = holder.Client(path)
    client.hold(NAME, netns.path(NAME), "t")
    proc.send_signal(signal.SIGTERM)
    assert waiting.until(client.stopping, within_s=5, every_s=0.05)
    time.sleep(1.5)
    assert proc.poll() is None, "it left before the agent removed the fabrics"
    client.drop(NAME)
    assert proc.wait(timeout=5) == 0


@pytest.mark.netns
def test_it_holds_past_a_thousand_descriptors_and_a_new_client_still_gets_them(
        running_holder, namespace_with_a_link):
    """select() fails on a descriptor numbered 1024 or more: a holder of ~1,100
    namespace files must still take a new agent's connection."""
    _, path = running_holder
    client = holder.Client(path)
    names = [f"{NAME}.{i}" for i in range(1100)]
    for name in names:
        client.hold(name, netns.path(NAME), "t")
    kept = holder.Client(path).held()
    try:
        assert sorted(kept) == sorted(names)
    finally:
        for each in kept.values():
            os.close(each.fd)


@pytest.mark.netns
def test_a_client_asks_again_on_a_new_connection_after_the_holder_restarted(
        tmp_path, namespace_with_a_link):
    path = str(tmp_path / "holder.sock")

    def start():
        proc = subprocess.Popen([sys.executable, "-m", "tailcut.k8s.agent.holder", path])
        assert waiting.until(lambda: os.path.exists(path), within_s=10)
        return proc
    first = start()
    client = holder.Client(path)
    client.hold(NAME, netns.path(NAME), "t")
    first.kill()
    first.wait()
    os.unlink(path)
    second = start()
    try:
        client.hold(NAME, netns.path(NAME), "t")   # on the old, dead connection first
        assert list(client.held()) == [NAME]
    finally:
        second.kill()
        second.wait()
