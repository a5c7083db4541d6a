from __future__ import annotations

import pytest

from coral_hpc.types import JobTag


def test_tag_round_trips_through_comment():
    tag = JobTag("demo", "qwen3-8b", "r0007", "t-a100x2")
    assert JobTag.from_comment(tag.comment()) == tag
    assert tag.job_name() == "coral.demo.qwen3-8b.r0007"


@pytest.mark.parametrize("comment", [None, "", "someone else's job", "coral:model=x", "coral:deployment=d;model"])
def test_foreign_or_broken_comments_are_not_ours(comment):
    assert JobTag.from_comment(comment) is None


def test_unsafe_fields_are_refused():
    with pytest.raises(ValueError):
        JobTag("demo", "a;b", "r1")
