"""The generic Registry every extension point uses: lookups, refusals, order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.registry import Registry


def test_registered_entries_come_back_by_name_in_registration_order():
    colours: Registry[int] = Registry("paint.colour")

    @colours.register("red")
    def red() -> int:
        return 1

    colours.add("blue", lambda: 2)
    assert colours.names() == ("red", "blue")
    assert colours.get("red") is red
    assert "blue" in colours and "green" not in colours
    assert len(colours) == 2


def test_an_unknown_name_is_refused_naming_the_field_and_the_choices():
    routers: Registry[str] = Registry("router.name")
    routers.add("round_robin", "rr")
    routers.add("least_requests", "lr")
    message = r"router.name must be one of \['round_robin', 'least_requests'\], got 'least_request'"
    with pytest.raises(ValueError, match=message):
        routers.get("least_request")
    with pytest.raises(ValueError, match="router.name"):
        routers.check(3)
    routers.check("round_robin")


def test_a_name_registered_twice_or_empty_is_refused():
    registry: Registry[int] = Registry("thing")
    registry.add("a", 1)
    with pytest.raises(ValueError, match="registered twice"):
        registry.add("a", 2)
    with pytest.raises(ValueError, match="non-empty string"):
        registry.add("", 3)
    assert registry.get("a") == 1


@given(st.lists(st.text(min_size=1, max_size=8), unique=True, max_size=12))
def test_names_are_exactly_what_was_registered(names):
    registry: Registry[int] = Registry("x")
    for i, name in enumerate(names):
        registry.add(name, i)
    assert registry.names() == tuple(names)
    assert [registry.get(n) for n in names] == list(range(len(names)))
