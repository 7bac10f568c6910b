"""GpuConfig: strict validation with actionable messages, merge precedence, schema freshness."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_gpu.config import (
    ConfigError,
    GpuSharingMode,
    NodeSharing,
    Priority,
    Strategy,
    merge_configs,
    parse_gpu_config,
)

API = {"apiVersion": "gpu.dra-gpu.io/v1alpha1", "kind": "GpuConfig"}


def cfg(**sharing: Any) -> dict[str, Any]:
    return {**API, "sharing": sharing}


def entry(
    source: str, params: dict[str, Any], requests: list[str] | None = None, driver: str = "gpu.dra-gpu.io"
):
    return {"source": source, "requests": requests or [], "opaque": {"driver": driver, "parameters": params}}


def test_valid_configs_parse() -> None:
    assert parse_gpu_config(API).sharing.strategy is Strategy.EXCLUSIVE
    limiter = parse_gpu_config(cfg(strategy="Limiter", limiter={"memory": "10Gi", "cores": 30}))
    assert limiter.sharing.limiter is not None
    assert limiter.sharing.limiter.memory_bytes() == 10 * 2**30
    ts = parse_gpu_config(cfg(strategy="TimeSlicing", timeSlicing={"interval": "Long"}))
    assert ts.sharing.timeSlicing is not None and ts.sharing.timeSlicing.interval == "Long"


def test_unknown_strategy_names_field_and_allowed_values() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_gpu_config(cfg(strategy="Fractional"))
    message = str(exc.value)
    assert "sharing.strategy" in message
    assert "'Fractional'" in message
    for allowed in ("Exclusive", "TimeSlicing", "MPS", "Limiter"):
        assert allowed in message


def test_negative_memory_is_rejected_with_field_name() -> None:
    with pytest.raises(ConfigError, match=r"sharing\.limiter\.memory: memory must be positive, got '-1Gi'"):
        parse_gpu_config(cfg(strategy="Limiter", limiter={"memory": "-1Gi"}))


def test_bad_quantity_and_out_of_range_cores() -> None:
    with pytest.raises(ConfigError, match=r"sharing\.limiter\.memory: '10 gigs' is not a quantity"):
        parse_gpu_config(cfg(strategy="Limiter", limiter={"memory": "10 gigs"}))
    with pytest.raises(
        ConfigError, match=r"sharing\.limiter\.cores: .*less than or equal to 100 \(got 150\)"
    ):
        parse_gpu_config(cfg(strategy="Limiter", limiter={"cores": 150}))


def test_wrong_type_is_rejected_not_coerced() -> None:
    with pytest.raises(ConfigError, match=r"sharing\.limiter\.cores"):
        parse_gpu_config(cfg(strategy="Limiter", limiter={"cores": "30"}))


def test_unknown_field_lists_allowed_fields() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_gpu_config({**API, "sharing": {"strategy": "MPS", "mps": {"threads": 10}}})
    assert "sharing.mps.threads: unknown field; allowed fields here: defaultActiveThreadPercentage" in str(
        exc.value
    )


def test_section_must_match_strategy() -> None:
    with pytest.raises(ConfigError, match=r"sharing\.mps is set but sharing\.strategy is TimeSlicing"):
        parse_gpu_config(cfg(strategy="TimeSlicing", mps={"defaultActiveThreadPercentage": 20}))


def test_wrong_api_version_and_kind() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_gpu_config({"apiVersion": "gpu.dra-gpu.io/v1", "kind": "GPUConfig"})
    assert "apiVersion: must be 'gpu.dra-gpu.io/v1alpha1'" in str(exc.value)
    assert "kind: must be 'GpuConfig'" in str(exc.value)


def test_not_an_object() -> None:
    with pytest.raises(ConfigError, match="expected an object, got list"):
        parse_gpu_config([1, 2])
    with pytest.raises(ConfigError, match="not JSON"):
        parse_gpu_config("{nope")


def test_compute_ceiling_and_priority_parse_and_default_to_a_fixed_standard_share() -> None:
    config = parse_gpu_config(
        cfg(strategy="Limiter", limiter={"cores": 30, "compute": {"limit": 100, "priority": "latency"}})
    )
    assert config.sharing.limiter is not None and config.sharing.limiter.compute is not None
    assert config.sharing.limiter.compute.limit == 100
    assert config.sharing.limiter.compute.priority is Priority.LATENCY
    defaults = parse_gpu_config(cfg(strategy="Limiter", limiter={"cores": 30, "compute": {}}))
    assert defaults.sharing.limiter is not None and defaults.sharing.limiter.compute is not None
    assert defaults.sharing.limiter.compute.limit is None
    assert defaults.sharing.limiter.compute.priority is Priority.STANDARD


def test_a_compute_limit_below_the_floor_is_one_line_saying_what_to_change() -> None:
    with pytest.raises(ConfigError) as info:
        parse_gpu_config(cfg(strategy="Limiter", limiter={"cores": 50, "compute": {"limit": 40}}))
    assert str(info.value) == (
        "invalid GpuConfig: sharing.limiter: compute.limit 40 is below cores 50; cores is the guaranteed "
        "floor and the limit the ceiling above it: raise compute.limit or lower cores"
    )


def test_bad_compute_values_name_the_field_and_what_is_allowed() -> None:
    with pytest.raises(ConfigError, match=r"sharing\.limiter\.compute\.limit: .*less than or equal to 100"):
        parse_gpu_config(cfg(strategy="Limiter", limiter={"compute": {"limit": 150}}))
    with pytest.raises(ConfigError, match=r"sharing\.limiter\.compute\.limit: .*greater than or equal to 1"):
        parse_gpu_config(cfg(strategy="Limiter", limiter={"compute": {"limit": 0}}))
    with pytest.raises(
        ConfigError,
        match=r"sharing\.limiter\.compute\.priority: unknown compute priority 'realtime'; "
        r"allowed: latency, standard, besteffort",
    ):
        parse_gpu_config(cfg(strategy="Limiter", limiter={"compute": {"priority": "realtime"}}))
    with pytest.raises(
        ConfigError,
        match=r"sharing\.limiter\.compute\.burst: unknown field; allowed fields here: limit, priority",
    ):
        parse_gpu_config(cfg(strategy="Limiter", limiter={"compute": {"burst": 1}}))


def test_a_claims_compute_section_overrides_its_class_as_a_whole() -> None:
    configs = [
        entry("FromClass", cfg(strategy="Limiter", limiter={"cores": 20, "compute": {"limit": 100}})),
        entry(
            "FromClaim", cfg(strategy="Limiter", limiter={"cores": 30, "compute": {"priority": "latency"}})
        ),
    ]
    limiter = merge_configs(configs, "gpu").sharing.limiter
    assert limiter is not None and limiter.compute is not None
    assert (limiter.cores, limiter.compute.limit, limiter.compute.priority) == (30, None, Priority.LATENCY)


# -- merge -----------------------------------------------------------------------------------------


def test_claim_config_overrides_class_config() -> None:
    configs = [
        entry("FromClass", cfg(strategy="Limiter"), ["gpu"]),
        entry("FromClaim", cfg(strategy="Limiter", limiter={"memory": "4Gi"}), ["gpu"]),
    ]
    merged = merge_configs(configs, "gpu")
    assert merged.sharing.limiter is not None and merged.sharing.limiter.memory == "4Gi"


def test_request_specific_beats_general_within_a_source() -> None:
    configs = [
        entry("FromClaim", cfg(strategy="TimeSlicing", timeSlicing={"interval": "Short"}), ["a"]),
        entry("FromClaim", cfg(strategy="MPS")),  # later, but applies to all requests
    ]
    assert merge_configs(configs, "a").sharing.strategy is Strategy.TIME_SLICING
    assert merge_configs(configs, "b").sharing.strategy is Strategy.MPS


def test_claim_general_beats_class_specific() -> None:
    configs = [
        entry("FromClass", cfg(strategy="Limiter"), ["gpu"]),
        entry("FromClaim", cfg(strategy="TimeSlicing")),
    ]
    assert merge_configs(configs, "gpu").sharing.strategy is Strategy.TIME_SLICING


def test_later_entry_wins_at_equal_rank_and_subrequests_match_base_name() -> None:
    configs = [
        entry("FromClass", cfg(strategy="MPS"), ["gpu"]),
        entry("FromClass", cfg(strategy="Limiter"), ["gpu"]),
    ]
    assert merge_configs(configs, "gpu/large").sharing.strategy is Strategy.LIMITER


def test_other_drivers_and_other_requests_are_ignored() -> None:
    configs = [
        entry("FromClaim", {"anything": True}, driver="nic.example.com"),
        entry("FromClaim", cfg(strategy="MPS"), ["other"]),
    ]
    assert merge_configs(configs, "gpu").sharing.strategy is Strategy.EXCLUSIVE


def test_invalid_config_names_its_source() -> None:
    configs = [entry("FromClass", cfg(strategy="Limiter")), entry("FromClaim", cfg(strategy="Nope"), ["gpu"])]
    with pytest.raises(
        ConfigError, match=r"FromClaim config #1 for request 'gpu': invalid GpuConfig: sharing\.strategy"
    ):
        merge_configs(configs, "gpu")


def test_real_scheduler_config_order_merges_to_claim_config() -> None:
    with open("tests/fixtures/k8s-1.36-real/resourceclaims-after-scheduling.json") as f:
        claims = json.load(f)["items"]
    ctrl = next(c for c in claims if c["metadata"]["name"] == "ctrl-alloc")
    merged = merge_configs(ctrl["status"]["allocation"]["devices"]["config"], "gpu")
    assert merged.sharing.strategy is Strategy.LIMITER


# -- property: only ConfigError escapes ------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
near_valid = st.fixed_dictionaries(
    {
        "apiVersion": st.sampled_from(["gpu.dra-gpu.io/v1alpha1", "x"]),
        "kind": st.sampled_from(["GpuConfig", 1]),
    },
    optional={
        "sharing": st.fixed_dictionaries(
            {"strategy": st.sampled_from(["Exclusive", "TimeSlicing", "MPS", "Limiter", "Bad", 3])},
            optional={
                "limiter": st.dictionaries(
                    st.sampled_from(["memory", "cores", "compute", "x"]), json_values, max_size=3
                ),
                "mps": st.dictionaries(
                    st.sampled_from(["defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit"]),
                    json_values,
                ),
                "timeSlicing": st.dictionaries(st.sampled_from(["interval"]), json_values),
            },
        ),
        "placement": json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_values, near_valid))
def test_arbitrary_json_raises_only_config_error(data: Any) -> None:
    try:
        parsed = parse_gpu_config(data)
    except ConfigError as exc:
        assert str(exc).startswith("invalid GpuConfig")
    else:
        assert parsed.apiVersion == "gpu.dra-gpu.io/v1alpha1"


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40))
def test_arbitrary_text_raises_only_config_error(text: str) -> None:
    with contextlib.suppress(ConfigError):
        parse_gpu_config(text)


# -- node sharing ----------------------------------------------------------------------------------


def test_node_sharing_parse_and_lookup() -> None:
    sharing = NodeSharing.parse("*=Shared,1=MPS,GPU-abc=Exclusive")
    assert sharing.mode_for(0, "GPU-x") is GpuSharingMode.SHARED
    assert sharing.mode_for(1, "GPU-y") is GpuSharingMode.MPS
    assert sharing.mode_for(1, "GPU-abc") is GpuSharingMode.EXCLUSIVE
    assert NodeSharing.parse("mps").default is GpuSharingMode.MPS


def test_node_sharing_rejects_unknown_mode_and_key() -> None:
    with pytest.raises(ConfigError, match="unknown mode 'Fractional'; allowed: Exclusive, Shared, MPS"):
        NodeSharing.parse("0=Fractional")
    with pytest.raises(ConfigError, match="the key must be"):
        NodeSharing.parse("gpu0=MPS")


def test_schema_file_is_fresh() -> None:
    from dra_gpu.commands.schema import DEFAULT_PATH, render

    assert DEFAULT_PATH.read_text() == render(), "run `dra-gpu schema --write`"
