"""jaxinfer/env_switch.py: one spelling of "off" for every JAXINFER_* switch."""
import pytest

from jaxinfer.env_switch import auto_switch, is_off, switch


@pytest.mark.parametrize("value", ["0", "false", "FALSE", "no", "Off", " off "])
def test_off_values(value):
    assert is_off(value)
    assert not switch("X", environ={"X": value})


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "", "2"])
def test_other_values_are_on(value):
    assert not is_off(value)
    assert switch("X", default=False, environ={"X": value})


def test_unset_takes_the_default():
    assert switch("X", environ={}) and not switch("X", default=False, environ={})


def test_auto_switch_is_none_unset_or_auto():
    assert auto_switch("X", environ={}) is None and auto_switch("X", environ={"X": " Auto "}) is None
    assert auto_switch("X", environ={"X": "0"}) is False and auto_switch("X", environ={"X": "1"}) is True
