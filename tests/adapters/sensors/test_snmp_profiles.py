"""Profiles as data: parsing with named errors, sysObjectID matching, value conversion."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from pysnmp.proto import rfc1902, rfc1905

from adapters.sensors.snmp_client import decode, text
from adapters.sensors.snmp_profiles import (
    ProfileError,
    Scale,
    load_profile_file,
    load_profiles,
    oid_tuple,
    parse_profile,
    select_profile,
    shipped_profiles,
)
from adapters.sensors.snmp_scaling import Missing, conversion, scale_factor
from policies.model import SensorKind
from tests.support.paths import ROOT

MINIMAL: dict[str, Any] = {
    "id": "x",
    "match": ["1.3.6.1.4.1.99999"],
    "sensor": [{"id": "t", "oid": "1.3.6.1.4.1.99999.1.0", "kind": "temperature", "divisor": 10}],
}


def _with(**changes: Any) -> dict[str, Any]:
    data = {**MINIMAL, "sensor": [dict(MINIMAL["sensor"][0])]}
    for key, value in changes.items():
        if key.startswith("sensor_"):
            data["sensor"][0][key.removeprefix("sensor_")] = value
        else:
            data[key] = value
    return data


def test_every_shipped_profile_parses_and_has_a_unique_id() -> None:
    profiles = shipped_profiles()
    ids = [p.id for p in profiles]
    assert len(ids) == len(set(ids))
    for family in ("apc-rpdu2", "apc-inrow", "raritan-px", "raritan-px2", "sentry3", "sentry4"):
        assert family in ids
    for family in ("eaton-epdu", "vertiv-geist", "gude-epc8031", "schleifenbauer"):
        assert family in ids
    assert "rittal-cmc3" in ids and "entity-sensor" in ids
    assert [p.id for p in profiles if p.fallback] == ["entity-sensor"]


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"sensor_kind": "heat"}, "sensor[0].kind: unknown kind 'heat'"),
        ({"sensor_oid": "1.3.six"}, "sensor[0].oid: must be a numeric OID"),
        ({"sensor_divisor": 0}, "sensor[0].divisor: must not be 0"),
        ({"sensor_colour": "red"}, "sensor[0].colour: unknown key"),
        ({"sensor_id": "a.{nope}"}, "refers to {nope}"),
        ({"sensor_transform": "kelvin"}, "sensor[0].transform: must be one of"),
        ({"sensor_kind": "airflow"}, "sensor[0].unit: required for kind 'airflow'"),
        ({"match": []}, "match: list at least one sysObjectID prefix"),
        ({"max_repetitions": 500}, "max_repetitions: must be 1..100"),
    ],
)
def test_profile_errors_name_the_key(changes: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ProfileError) as err:
        parse_profile(_with(**changes), "my.toml")
    assert fragment in str(err.value)
    assert str(err.value).startswith("my.toml: ")


def test_table_templates_may_only_use_fields_index_and_labels() -> None:
    sensor: dict[str, Any] = {
        "id": "p.{name}.{index2}.{probe}",
        "value": "1.3.6.1.4.1.99999.2.1.3",
        "kind": "inlet_temperature",
        "labels": {"probe": "{index1}"},
        "match": {"colour": "red"},
    }
    table = {
        "walk": "1.3.6.1.4.1.99999.2.1.2",
        "fields": {"name": "1.3.6.1.4.1.99999.2.1.2"},
        "sensor": [sensor],
    }
    data = {"id": "t", "match": ["1.3.6.1.4.1.99999"], "table": [table]}
    with pytest.raises(ProfileError, match=r"table\[0\]\.sensor\[0\]\.match\.colour"):
        parse_profile(data, "t.toml")
    del sensor["match"]
    profile = parse_profile(data, "t.toml")
    assert profile.tables[0].sensors[0].kind is SensorKind.INLET_TEMPERATURE
    assert profile.tables[0].sensors[0].unit == "celsius"


def test_longest_prefix_wins_and_fallback_applies_only_without_a_match() -> None:
    profiles = shipped_profiles()
    assert select_profile(profiles, oid_tuple("1.3.6.1.4.1.13742.6")).id == "raritan-px2"  # type: ignore[union-attr]
    assert select_profile(profiles, oid_tuple("1.3.6.1.4.1.13742.4")).id == "raritan-px"  # type: ignore[union-attr]
    # A prefix matches whole components only: 13742.40 is not 13742.4.
    chosen = select_profile(profiles, oid_tuple("1.3.6.1.4.1.13742.40"))
    assert chosen is not None and chosen.id == "entity-sensor"
    assert select_profile(profiles, oid_tuple("1.3.6.1.4.1.318.1.3.14.5")).id == "apc-inrow"  # type: ignore[union-attr]
    assert select_profile(profiles, oid_tuple("1.3.6.1.4.1.318.1.3.4.6")).id == "apc-rpdu2"  # type: ignore[union-attr]
    forced = select_profile(profiles, oid_tuple("1.3.6.1.4.1.318.1.3.4.6"), "sentry4")
    assert forced is not None and forced.id == "sentry4"
    assert select_profile(profiles, (), "no-such-profile") is None


def test_profile_dir_adds_and_replaces_profiles(tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(
        'id = "sentry4"\nmatch = ["1.3.6.1.4.1.1718.4"]\n'
        '[[sensor]]\nid = "x.temperature"\noid = "1.3.6.1.4.1.1718.4.1.1.0"\n'
        'kind = "temperature"\n'
    )
    profiles = {p.id: p for p in load_profiles(tmp_path)}
    assert profiles["sentry4"].path == str(mine)
    assert len(profiles["sentry4"].scalars) == 1
    (tmp_path / "broken.toml").write_text("id = \n")
    with pytest.raises(ProfileError, match=r"broken\.toml: not valid TOML"):
        load_profiles(tmp_path)


def test_docs_example_profile_loads(tmp_path: Path) -> None:
    """The profile written out in docs/pdu-profiles.md is valid."""
    doc = (ROOT / "docs" / "pdu-profiles.md").read_text()
    start = doc.index("```toml\n") + len("```toml\n")
    example = doc[start : doc.index("```", start)]
    path = tmp_path / "example.toml"
    path.write_text(example)
    profile = load_profile_file(path)
    assert profile.tables and tomllib.loads(example)["id"] == profile.id


def _conv(**changes: Any) -> Any:
    profile = parse_profile(_with(**changes), "c.toml")
    return conversion(profile.scalars[0], {})


def test_conversion_scales_checks_range_and_sentinels() -> None:
    conv = _conv(sensor_sentinels=[-1, -410])
    assert conv.apply(235) == pytest.approx(23.5)
    assert conv.apply(b"23.5") == pytest.approx(2.35)  # numeric text is accepted
    assert conv.apply(-410) == "no probe fitted (sentinel -410)"
    assert conv.apply(b"-1") == "no probe fitted (sentinel -1)"
    assert "out of range: 300 celsius" in conv.apply(3000)
    assert conv.apply(b"\xffjunk").startswith("not a number: OctetString")
    assert conv.apply(Missing("noSuchInstance")) == "noSuchInstance"
    fahrenheit = _conv(sensor_transform="fahrenheit_to_celsius")
    assert fahrenheit.apply(986) == pytest.approx(37.0)
    flow = _conv(sensor_kind="coolant_flow", sensor_divisor=100, sensor_multiplier=60)
    assert flow.apply(53) == pytest.approx(31.8)


@pytest.mark.parametrize(
    ("mode", "raw_scale", "raw", "expected"),
    [
        ("decimal_digits", "1", 229, 22.9),
        ("decimal_digits", "3", 3497, 3.497),
        ("decimal_digits", "0", 15, 15.0),
        ("signed_factor", "-100", 1610, 16.1),
        ("signed_factor", "10", 5, 50.0),
        ("si_prefix", "8", 4500, 4.5),  # milli
        ("si_prefix", "10", 2, 2000.0),  # kilo
    ],
)
def test_scale_fields(mode: str, raw_scale: str, raw: int, expected: float) -> None:
    data = {
        "id": "s",
        "match": ["1.3.6.1.4.1.99999"],
        "table": [
            {
                "walk": "1.3.6.1.4.1.99999.1.1",
                "fields": {"scale": "1.3.6.1.4.1.99999.1.2"},
                "sensor": [
                    {
                        "id": "x{index}",
                        "value": "1.3.6.1.4.1.99999.1.3",
                        "kind": "temperature",
                        "min": -1e9,
                        "max": 1e9,
                        "scale": [{"field": "scale", "mode": mode}],
                    }
                ],
            }
        ],
    }
    spec = parse_profile(data, "s.toml").tables[0].sensors[0]
    conv = conversion(spec, {"scale": raw_scale})
    assert not isinstance(conv, str)
    assert conv.apply(raw) == expected  # exact: dividing by powers of ten


def test_unusable_scale_field_is_a_reason() -> None:
    assert scale_factor(Scale("digits", "decimal_digits"), "n/a") == (
        "scale field 'digits' is not an integer: 'n/a'"
    )
    assert scale_factor(Scale("scale", "signed_factor"), "0") == "scale field 'scale' is 0"


def test_decode_maps_snmp_exceptions_and_types() -> None:
    assert decode(rfc1905.NoSuchObject("")) == Missing("noSuchObject")
    assert decode(rfc1905.NoSuchInstance("")) == Missing("noSuchInstance")
    assert decode(rfc1905.EndOfMibView("")) == Missing("endOfMibView")
    assert decode(rfc1902.Gauge32(7)) == 7
    assert decode(rfc1902.Integer32(-410)) == -410
    assert decode(rfc1902.Counter64(2**40)) == 2**40
    assert decode(rfc1902.OctetString(b"L1")) == b"L1"
    assert isinstance(decode(rfc1902.ObjectIdentifier("1.3.6")), Missing)
    assert text(rfc1902.OctetString(b"Temperature 1")) == "Temperature 1"
    assert text(rfc1902.Integer32(3)) == "3"
