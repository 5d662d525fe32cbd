"""CDU profiles as data, units and their conversions; the TCD profile against the real nodeset."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest

from adapters.errors import SourceSetupError
from adapters.sensors.opcua_profiles import (
    KIND_UNITS,
    UNITS,
    UNITS_BY_UNECE,
    load_profile,
    parse_path,
    parse_profile,
    profile_names,
    unece_code,
)
from policies.model import SensorKind
from tests.support.paths import SHARED_DATA

TCD_XML = SHARED_DATA / "opcua" / "Opc.Ua.PlasticsRubber.TCD.NodeSet2.xml"
GT_XML = SHARED_DATA / "opcua" / "Opc.Ua.PlasticsRubber.GeneralTypes.NodeSet2.xml"


def test_shipped_profiles_load_and_cover_the_cdu_kinds() -> None:
    assert profile_names() == ["generic", "opc40082-tcd"]
    generic = load_profile("generic")
    kinds = {v.kind for v in generic.variables}
    assert kinds == {
        SensorKind.COOLANT_SUPPLY_TEMPERATURE,
        SensorKind.COOLANT_RETURN_TEMPERATURE,
        SensorKind.COOLANT_FLOW,
        SensorKind.COOLANT_DIFFERENTIAL_PRESSURE,
        SensorKind.PUMP_SPEED,
        SensorKind.PUMP_STATE,
        SensorKind.LEAK,
        SensorKind.ALARM,
    }
    tcd = load_profile("opc40082-tcd")
    assert tcd.variable("differential_pressure").unit.name == "bar"
    assert tcd.variable("pump_state").transform == "nonzero"
    assert tcd.variable("alarm").canonical_unit == "severity"


def test_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(SourceSetupError, match="known: generic, opc40082-tcd"):
        load_profile("vendor-x")


def test_unece_codes_are_packed_ascii() -> None:
    # OPC-UA Part 8: UnitId = the code's ASCII bytes as an integer ("CEL" = 0x43454C).
    assert unece_code("CEL") == 0x43454C
    assert unece_code("P1") == 0x5031
    assert UNITS_BY_UNECE[0x424152].name == "bar"


@pytest.mark.parametrize(
    ("unit", "raw", "expected"),
    [
        ("celsius", 30.0, 30.0),
        ("kelvin", 303.15, 30.0),
        ("fahrenheit", 86.0, 30.0),
        ("bar", 1.2, 120.0),
        ("millibar", 1200.0, 120.0),
        ("pascals", 120_000.0, 120.0),
        ("psi", 1.0, 6.894757),
        ("cubic_meters_per_hour", 2.4, 40.0),
        ("liters_per_minute", 40.0, 40.0),
    ],
)
def test_units_convert_to_the_canonical_unit(unit: str, raw: float, expected: float) -> None:
    assert UNITS[unit].convert(raw) == pytest.approx(expected)


def test_every_canonical_unit_is_a_cdu_kinds_unit() -> None:
    kind_units = {u for u, _, _ in KIND_UNITS.values()}
    # rpm: pump speed may be stated in rpm as well as in percent.
    assert {u.canonical for u in UNITS.values()} <= kind_units | {"bool", "rpm"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"variables": {}}, "are required"),
        ({"variables": {"x": {"kind": "gpu_power", "path": "0:X"}}}, "not a CDU kind"),
        ({"variables": {"x": {"kind": "coolant_flow", "path": "0:X", "unit": "bar"}}}, "fit"),
        ({"variables": {"x": {"kind": "coolant_flow", "path": "v:X"}}}, "alias 'v'"),
        ({"variables": {"x": {"kind": "coolant_flow", "path": "NoAlias"}}}, "alias:Name"),
        ({"variables": {"x": {"kind": "coolant_flow"}}}, r"variables\.x\.path: required key"),
        (
            {"variables": {"x": {"kind": "leak", "path": "0:X", "transform": "x"}}},
            "transform: must be",
        ),
        # A mistyped key is reported as itself, not as the key it left missing.
        ({"variables": {"x": {"kind": "leak", "paht": "0:X"}}}, r"variables\.x\.paht: unknown key"),
        ({"variable": {}}, "variable: unknown key"),
    ],
)
def test_broken_profiles_name_the_variable(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_profile({"root": "0:CDU", **data}, origin="t")


def test_parse_path() -> None:
    path = parse_path("/tcd:DeviceZone_1/gt:ActualValue")
    assert [str(e) for e in path] == ["tcd:DeviceZone_1", "gt:ActualValue"]


def test_tcd_profile_browse_names_exist_in_the_nodeset() -> None:
    if not TCD_XML.is_file() or not GT_XML.is_file():
        pytest.skip(f"OPC 40082-1 nodesets not found under {SHARED_DATA / 'opcua'}")
    names = {
        alias: {
            html.unescape(n)
            for n in re.findall(r'BrowseName="1:([^"]+)"', xml.read_text(encoding="utf-8"))
        }
        for alias, xml in (("tcd", TCD_XML), ("gt", GT_XML))
    }
    profile = load_profile("opc40082-tcd")
    for var in profile.variables:
        for element in var.path:
            # Numbered instances (DeviceZone_1) come from a placeholder named DeviceZone.
            name = re.sub(r"_\d+$", "", element.name)
            assert name in names[element.namespace], (var.key, str(element))
