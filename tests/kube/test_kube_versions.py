"""Kubernetes feature levels: the server's version as the driver reads it, and a FakeKube of a release that
keeps, validates or silently drops the 1.37/1.38 counter fields as that release's API server does."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_gpu.kube import builders
from dra_gpu.kube.errors import Invalid
from dra_gpu.kube.fake import FakeKube
from dra_gpu.kube.validation import slice_errors
from dra_gpu.kube.versions import (
    COMPATIBILITY_GROUPS,
    SHARED_CONSUMABLE_CAPACITY,
    from_version_info,
    gate_default,
    parse_version,
    resolves_qualified_capacity_names,
)

Obj = dict[str, Any]


def placement(groups: Any = None, value_from: str | None = None) -> Obj:
    """A device slice with one MIG-like placement consuming from the pool's counter set."""
    counter: Obj = {"valueFrom": {"capacityName": value_from}} if value_from else {"value": "1"}
    entry: Obj = {"counterSet": "gpu-0-mig", "counters": {"memory-slice-0": counter}}
    if groups is not None:
        entry["compatibilityGroups"] = groups
    device = {
        "name": "gpu-0-mig-1g10gb-0",
        "attributes": {"type": {"string": "mig"}},
        "consumesCounters": [entry],
    }
    spec = builders.slice_spec(
        "gpu.dra-gpu.io", "node-1", "node-1", devices=[device], generation=1, slice_count=2
    )
    return builders.resource_slice(spec, generate_name="00001-gpu.dra-gpu.io-node-1-")


def stored_entry(api: FakeKube, obj: Obj) -> Obj:
    entry: Obj = api.create("ResourceSlice", copy.deepcopy(obj))["spec"]["devices"][0]["consumesCounters"][0]
    return entry


@pytest.mark.parametrize(
    ("info", "version"),
    [
        ({"major": "1", "minor": "38", "gitVersion": "v1.38.0"}, (1, 38)),
        ({"major": "1", "minor": "37+", "gitVersion": "v1.37.2-eks-1"}, (1, 37)),
        ({"major": "", "minor": "", "gitVersion": "v1.36.1"}, (1, 36)),
    ],
)
def test_the_servers_version_is_read_from_its_version_answer(info: Obj, version: tuple[int, int]) -> None:
    assert from_version_info(info) == version
    assert resolves_qualified_capacity_names(version) == (version >= (1, 38))


def test_gate_defaults_follow_the_releases() -> None:
    assert [gate_default(COMPATIBILITY_GROUPS, (1, m)) for m in (36, 37, 38)] == [False, False, True]
    assert [gate_default(SHARED_CONSUMABLE_CAPACITY, (1, m)) for m in (37, 38)] == [False, False], "alpha"
    with pytest.raises(ValueError):
        parse_version("one.thirty-eight")


@pytest.mark.parametrize("version", [(1, 36), (1, 37)])
def test_a_server_before_1_38_drops_the_groups_silently_and_value_from_leaves_no_value(
    version: tuple[int, int],
) -> None:
    api = FakeKube(version=version)
    assert api.server_version() == version
    assert "compatibilityGroups" not in stored_entry(api, placement(["mig"]))
    with pytest.raises(Invalid, match=r"counters\[memory-slice-0\].value: Required value"):
        api.create("ResourceSlice", placement(value_from="memory"))


def test_a_1_38_server_keeps_the_groups_and_with_the_alpha_gate_on_value_from() -> None:
    api = FakeKube(version=(1, 38), gates={SHARED_CONSUMABLE_CAPACITY: True})
    assert stored_entry(api, placement(["mig", "gpu-full"]))["compatibilityGroups"] == ["mig", "gpu-full"]
    kept = stored_entry(api, placement(value_from="memory"))["counters"]["memory-slice-0"]
    assert kept == {"valueFrom": {"capacityName": "memory"}}
    with pytest.raises(Invalid, match="value: Required value"):  # alpha: off unless enabled
        FakeKube(version=(1, 38)).create("ResourceSlice", placement(value_from="memory"))


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        (["a", "b", "c"], "compatibilityGroups: Too many: 3: must have at most 2 items"),
        (["Mig_Full"], "compatibilityGroups[0]: Invalid value"),
        (["mig", "mig"], 'compatibilityGroups[1]: Duplicate value: "mig"'),
        ([""], "compatibilityGroups[0]: Required value"),
        ("mig", "compatibilityGroups: Invalid value"),
    ],
)
def test_a_1_38_server_refuses_groups_that_break_the_upstream_rules(groups: Any, expected: str) -> None:
    assert slice_errors(placement(["mig"])) == []
    assert any(expected in e for e in slice_errors(placement(groups))), slice_errors(placement(groups))
    with pytest.raises(Invalid, match="compatibilityGroups"):
        FakeKube(version=(1, 38)).create("ResourceSlice", placement(groups))
    FakeKube(version=(1, 37)).create("ResourceSlice", placement(groups))  # dropped before it is judged


def test_a_consumed_counter_has_a_value_or_a_value_from_not_both() -> None:
    both = placement(value_from="memory")
    both["spec"]["devices"][0]["consumesCounters"][0]["counters"]["memory-slice-0"]["value"] = "1"
    assert any("exactly one of `value` or `valueFrom`" in e for e in slice_errors(both))
    assert any("capacityName" in e for e in slice_errors(placement(value_from="bad/name/x")))
