"""The in-network plan (tailcut.innetplan) and the programs it is for (tailcut.innetwork)
name the same kinds: a section nobody loads, or programs nobody plans, would be silent."""

from tailcut import innetplan, innetwork


def test_every_planned_kind_has_its_programs_in_the_plans_order() -> None:
    assert [kind.name for kind in innetwork.KINDS] == [kind.name for kind in innetplan.KINDS]
