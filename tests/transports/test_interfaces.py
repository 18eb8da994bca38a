"""Which interface holds an address, read with ioctls in this namespace."""

from tailcut.transports import interfaces


def test_the_loopback_address_is_held_by_lo() -> None:
    assert interfaces.holding("127.0.0.1") == "lo"


def test_an_address_no_interface_holds_is_none() -> None:
    assert interfaces.holding("203.0.113.9") is None   # TEST-NET-3: never configured


def test_the_way_to_a_loopback_peer_is_lo_and_its_address() -> None:
    assert interfaces.toward("127.0.0.1") == ("lo", "127.0.0.1")
