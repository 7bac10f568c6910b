"""One source for what a GpuConfig may be: the model, the JSON Schema, the claim admission policies and the node
accept exactly the same shapes (`gpuconfig_shapes`: valid configs of every mode, each field of the wrong type,
null, misplaced; sections under other strategies, the strategy left out, percents as strings and floats), so no
claim the API admits is refused on the node, and no shape makes the policy's CEL fail instead of a rule's
message."""

from __future__ import annotations

import pytest
from gpuconfig_shapes import Verdicts, judge, policy_answer, shapes


@pytest.fixture(scope="module")
def verdicts() -> list[Verdicts]:
    return judge()


def test_every_shape_gets_the_same_answer_from_all_four(verdicts: list[Verdicts]) -> None:
    assert len(verdicts) >= 100
    assert [v.shape.name for v in verdicts if not v.agree] == []


def test_no_claim_the_policy_admits_is_refused_on_the_node(verdicts: list[Verdicts]) -> None:
    assert [(v.shape.name, v.node) for v in verdicts if not v.policy and v.node] == []


def test_each_refusal_at_creation_is_a_rules_message_of_one_line(verdicts: list[Verdicts]) -> None:
    for v in verdicts:
        assert not v.cel_error, (v.shape.name, v.policy)
        assert all("\n" not in m for m in v.policy)


def test_a_null_or_a_string_percent_is_refused_saying_where_and_what_goes_there() -> None:
    by_name = {s.name: s for s in shapes()}
    (null,) = policy_answer(by_name["Limiter: sharing.limiter.compute null"])
    assert "malformed at sharing.limiter: " in null and "no null (leave a field out instead)" in null
    (text,) = policy_answer(by_name["Limiter: limiter.cores '30'"])
    assert "malformed at sharing.limiter: " in text and "cores (a whole number 1..100)" in text


def test_a_ceiling_without_a_floor_is_refused_where_the_node_would_drop_it(verdicts: list[Verdicts]) -> None:
    (floorless,) = [v for v in verdicts if v.shape.name == "Limiter: compute.limit with no cores anywhere"]
    assert floorless.model and floorless.schema, "a valid GpuConfig: the request holds the whole GPU"
    assert floorless.policy and "compute.limit below the cores" in floorless.policy[0]
    assert "is below the share's floor 100" in floorless.node
