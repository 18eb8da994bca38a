"""Tests of choosing a transport by name."""

import pytest

from tailcut import transports
from tailcut.spec import model, transport_kinds
from tailcut.transports import base, tcp


def test_get_builds_the_named_transport_with_its_options() -> None:
    transport = transports.get("tcp", max_elements=10)
    assert isinstance(transport, tcp.TcpTransport) and transport.max_elements == 10


def test_an_unknown_transport_name_lists_the_supported_ones() -> None:
    with pytest.raises(ValueError, match="unsupported transport .quic.; supported: tcp, udp, bounded-loss, app-drop"):
        transports.get("quic")


def test_an_unknown_option_is_named_with_the_options_that_exist() -> None:
    with pytest.raises(ValueError, match="no option loss_p.*max_elements"):
        transports.get("tcp", loss_p=0.1)


def test_every_declared_transport_loads_as_its_declared_class() -> None:
    # The spec, the planner and the operator read only the declarations
    # (tailcut.spec.transport_kinds); the roles build what each names.
    assert transports.names()[:4] == list(transport_kinds.BUILTIN_NAMES)
    for name in transport_kinds.BUILTIN_NAMES:
        factory = transports.load(name)
        assert issubclass(factory, base.Transport) and factory.name == name
    assert model.TRANSPORTS == transport_kinds.BUILTIN_NAMES   # the CRD's enum
