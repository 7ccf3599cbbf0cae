"""core.plan: Plan and its Steps are frozen dataclass records, not tuples, equal by value (their
callables not compared), with a plain to_dict()."""

import pytest

import bf16bridge as bb
from conftest import bf16_ramp, make


@pytest.mark.frameworks("torch")
def test_plan_and_step_are_frozen_records():
    import dataclasses

    p = bb.plan(make("torch", bf16_ramp()), to="numpy")
    assert dataclasses.is_dataclass(p) and dataclasses.is_dataclass(p.steps[0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.copies = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        tuple(p)  # a record, not a tuple to unpack
    assert p == bb.plan(make("torch", bf16_ramp()), to="numpy")  # equal without comparing callables
    assert p.to_dict()["steps"][0]["kind"] == "bitview"
