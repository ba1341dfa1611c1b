"""The residency plan (devices/residency.py): which blocks stay on the device, from byte counts alone."""

import pytest

from flux2_core.devices.residency import plan_residency

# Four blocks of 10, 40, 10 and 20 bytes in a model of 100 bytes: 20 bytes live outside the blocks.
BLOCKS, TOTAL, FIXED = [10, 40, 10, 20], 100, 20


def test_a_budget_of_zero_streams_every_block():
    plan = plan_residency(BLOCKS, TOTAL, 0)
    assert plan.resident == () and plan.streamed == (0, 1, 2, 3)
    assert plan.streamed_bytes == 80 and plan.resident_bytes == FIXED


def test_the_parts_outside_the_blocks_count_first():
    # A budget smaller than the fixed parts keeps no block, however small the blocks are.
    assert plan_residency(BLOCKS, TOTAL, FIXED + 9).resident == ()
    assert plan_residency(BLOCKS, TOTAL, FIXED + 10).resident == (0,)


def test_blocks_stay_in_run_order_while_they_fit_and_a_later_smaller_one_may_stay():
    # 20 + 10 leaves 15: block 1 (40) does not fit, block 2 (10) does, block 3 (20) no longer does.
    plan = plan_residency(BLOCKS, TOTAL, FIXED + 25)
    assert plan.resident == (0, 2) and plan.streamed == (1, 3)
    assert plan.resident_bytes == FIXED + 20 and plan.streamed_bytes == 60
    assert plan.resident_bytes + plan.streamed_bytes == TOTAL


def test_a_budget_as_large_as_the_model_streams_nothing():
    plan = plan_residency(BLOCKS, TOTAL, TOTAL)
    assert plan.streamed == () and plan.next_streamed == {} and plan.resident_bytes == TOTAL


def test_the_prefetch_chain_names_the_next_streamed_block_after_each_position():
    plan = plan_residency(BLOCKS, TOTAL, FIXED + 25)  # streamed: 1 and 3
    # -1: before the first block runs (while the inputs are embedded); the last streamed block has no next.
    assert plan.next_streamed == {-1: 1, 0: 1, 1: 3, 2: 3}


def test_sizes_that_cannot_be_a_model_are_refused():
    with pytest.raises(ValueError):
        plan_residency([10, -1], 100, 0)
    with pytest.raises(ValueError):
        plan_residency([60, 60], 100, 0)
