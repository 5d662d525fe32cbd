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


def test_energy_and_apparent_power_have_ranges_so_minus_one_is_never_good() -> None:
    # -1 "not measured" / 10 = -0.1 kWh: out of the energy range even without a sentinel.
    energy = _conv(kind="energy", divisor=10).apply(-1)
    assert isinstance(energy, str) and energy.startswith("out of range")
    va = _conv(kind="power", unit="volt_amperes").apply(-1)
    assert isinstance(va, str) and va.startswith("out of range")
    assert _conv(kind="energy", divisor=10).apply(351280) == pytest.approx(35128.0)


def test_sentinels_say_what_the_mib_says_they_mean() -> None:
    conv = _conv(kind="power", sentinels=[-1], sentinel_means="not measured")
    assert conv.apply(-1) == "not measured (sentinel -1)"
    assert conv.apply(b"-1") == "not measured (sentinel -1)"
    assert conv.is_sentinel(-1) and conv.is_sentinel(b" -1 ") and not conv.is_sentinel(0)
    assert _conv(kind="inlet_temperature", sentinels=[-410]).apply(-410) == (
        "no probe fitted (sentinel -410)"
    )
    with pytest.raises(ProfileError, match=r"sensor\[0\]\.sentinel_means: must say"):
        parse_profile(_profile(kind="power", sentinels=[-1], sentinel_means=" "), "x.toml")


@pytest.mark.parametrize(("scale", "raw", "expected"), [("10", 215, 21.5), ("1", 55, 55.0)])
def test_divisor_scale_divides_by_the_row_field(scale: str, raw: int, expected: float) -> None:
    spec = (
        parse_profile(
            {
                "id": "x",
                "match": ["1.3.6.1.4.1.99999"],
                "table": [
                    {
                        "walk": "1.3.6.1.4.1.99999.1",
                        "fields": {"scale": "1.3.6.1.4.1.99999.2"},
                        "sensor": [
                            {
                                "id": "t{index}",
                                "value": "1.3.6.1.4.1.99999.3",
                                "kind": "air_temperature",
                                "scale": [{"field": "scale", "mode": "divisor"}],
                            }
                        ],
                    }
                ],
            },
            "x.toml",
        )
        .tables[0]
        .sensors[0]
    )
    conv = conversion(spec, {"scale": scale})
    assert isinstance(conv, Conversion) and conv.apply(raw) == pytest.approx(expected)
    assert conversion(spec, {"scale": "0"}) == "scale field 'scale' is 0, not a divisor"


def test_products_mib_and_skip_are_profile_keys() -> None:
    data = {
        **_profile(kind="power", unit="volt_amperes", skip="apparent power"),
        "products": "Acme PDU 3000",
        "mib": "ACME-MIB rev 1",
    }
    profile = parse_profile(data, "x.toml")
    assert profile.products == "Acme PDU 3000" and profile.mib == "ACME-MIB rev 1"
    assert profile.scalars[0].skip == "apparent power"
