"""Profile rules an operator relies on: plausible ranges, units, precedence, named typos."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from adapters.sensors.snmp_profiles import (
    ProfileError,
    load_profiles,
    oid_tuple,
    parse_profile,
    select_profile,
)
from adapters.sensors.snmp_scaling import Conversion, conversion

SENTRY3 = "1.3.6.1.4.1.1718.3"


def _profile(**sensor: Any) -> dict[str, Any]:
    return {
        "id": "x",
        "match": ["1.3.6.1.4.1.99999"],
        "sensor": [{"id": "t", "oid": "1.3.6.1.4.1.99999.1.0", **sensor}],
    }


def _conv(**sensor: Any) -> Conversion:
    conv = conversion(parse_profile(_profile(**sensor), "x.toml").scalars[0], {})
    assert isinstance(conv, Conversion)
    return conv


@pytest.mark.parametrize(
    ("kind", "raw", "divisor", "good"),
    [
        ("inlet_temperature", 680, 10, False),  # 68 "degC": a Fahrenheit value read as Celsius
        ("inlet_temperature", 235, 1, False),  # a missing divisor
        ("inlet_temperature", 235, 10, True),
        ("inlet_temperature", -5, 1, False),
        ("coolant_supply_temperature", 1200, 10, False),
        ("coolant_flow", 50_000, 100, True),
        ("coolant_flow", 50_000, 1, False),
        ("humidity", 101, 1, False),
    ],
)
def test_values_outside_the_kinds_plausible_range_are_bad(
    kind: str, raw: int, divisor: int, good: bool
) -> None:
    result = _conv(kind=kind, divisor=divisor).apply(raw)
    assert isinstance(result, float) is good, result
    if not good:
        assert isinstance(result, str) and result.startswith("out of range")


def test_fahrenheit_unit_is_converted_to_celsius() -> None:
    spec = parse_profile(_profile(kind="inlet_temperature", unit="fahrenheit", divisor=10), "x")
    assert spec.scalars[0].unit == "celsius"
    conv = conversion(spec.scalars[0], {})
    assert isinstance(conv, Conversion)
    assert conv.apply(745) == pytest.approx(23.61, abs=0.01)
    with pytest.raises(ProfileError, match="unit: must be celsius"):
        parse_profile(_profile(kind="humidity", transform="fahrenheit_to_celsius"), "x")


def test_a_mistyped_key_is_reported_as_itself(tmp_path: Path) -> None:
    (tmp_path / "acme.toml").write_text(
        'id = "acme"\nmatch = ["1.3.6.1.4.1.99999"]\n'
        '[[table]]\nwalk = "1.3.6.1.4.1.99999.1.1.2"\n'
        'field = { name = "1.3.6.1.4.1.99999.1.1.2" }\n'
        '[[table.sensor]]\nid = "{name}.temperature"\nvalue = "1.3.6.1.4.1.99999.1.1.3"\n'
        'kind = "temperature"\n'
    )
    with pytest.raises(ProfileError) as err:
        load_profiles(tmp_path)
    message = str(err.value)
    assert "acme.toml: table[0].field: unknown key" in message
    assert "fields" in message  # the known keys are listed
    assert "refers to {name}" not in message


def _site(folder: Path, name: str, pid: str, match: str) -> None:
    (folder / name).write_text(
        f'id = "{pid}"\nmatch = ["{match}"]\n'
        f'[[sensor]]\nid = "x.temperature"\noid = "{match}.1.0"\nkind = "temperature"\n'
    )


def test_site_profiles_win_and_duplicate_ids_are_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    _site(tmp_path, "a.toml", "my-sentry3", SENTRY3)  # another id, the same match
    _site(tmp_path, "b.toml", "sentry4", "1.3.6.1.4.1.1718.4")  # a shipped id
    profiles = load_profiles(tmp_path)
    chosen = select_profile(profiles, oid_tuple(SENTRY3 + ".1"))
    assert chosen is not None and chosen.id == "my-sentry3" and chosen.site
    replaced = select_profile(profiles, oid_tuple("1.3.6.1.4.1.1718.4"))
    assert replaced is not None and replaced.path == str(tmp_path / "b.toml")
    assert any("replaces the shipped" in r.getMessage() for r in caplog.records)
    # A more specific shipped prefix still wins over a broad site one.
    _site(tmp_path, "c.toml", "broad", "1.3.6.1.4.1")
    chosen = select_profile(load_profiles(tmp_path), oid_tuple("1.3.6.1.4.1.318.1.3.4.6"))
    assert chosen is not None and chosen.id == "apc-rpdu2"

    _site(tmp_path, "d.toml", "my-sentry3", SENTRY3)
    with pytest.raises(ProfileError, match=r"d\.toml: id 'my-sentry3' is already defined by"):
        load_profiles(tmp_path)
