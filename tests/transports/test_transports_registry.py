"""Tests of choosing a transport by name."""

import pytest

from tailcut import transports
from tailcut.spec import model
from tailcut.transports import tcp


def test_get_builds_the_named_transport_with_its_options() -> None:
    transport = transports.get("tcp", max_elements=10)
    assert isinstance(transport, tcp.TcpTransport) and transport.max_elements == 10


def test_an_unknown_transport_name_lists_the_supported_ones() -> None:
    with pytest.raises(ValueError, match="transport 'quic' is unknown; supported: app-drop, bounded-loss, tcp, udp"):
        transports.get("quic")


def test_an_unknown_option_is_named_with_the_options_that_exist() -> None:
    with pytest.raises(ValueError, match="no option loss_p.*max_elements"):
        transports.get("tcp", loss_p=0.1)


def test_the_registry_serves_every_transport_a_spec_may_name() -> None:
    # Role configs are checked against the spec's names (tailcut.training.config,
    # which the operator loads without the transports), so the two lists must agree.
    assert transports.names() == sorted(model.TRANSPORTS)
