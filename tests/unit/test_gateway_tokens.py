"""Counting a whole answer's tokens (coral_hpc.gateway.tokens): the replica's ``usage`` when it
sent one, else about 4 characters per token of the prompt and of the answer's text."""

from __future__ import annotations

import json

from coral_hpc.gateway.tokens import count_whole_answer, estimate_prompt_tokens, usage_counts

CHAT = {"model": "m", "messages": [{"role": "user", "content": "x" * 40}]}


def test_the_replicas_usage_is_taken_as_it_is():
    answer = {"choices": [{"message": {"content": "y" * 400}}],
              "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}
    assert count_whole_answer(CHAT, json.dumps(answer).encode()) == (7, 3, False)


def test_without_usage_both_sides_are_estimated_from_their_text():
    answer = {"choices": [{"message": {"content": "y" * 41}}, {"text": "z" * 8}]}
    # prompt 40 chars → 10 tokens; answer 49 chars → 13 tokens (rounded up)
    assert count_whole_answer(CHAT, json.dumps(answer).encode()) == (10, 13, True)


def test_a_usage_that_is_not_one_is_estimated_not_trusted():
    answer = {"choices": [{"text": "abcd"}], "usage": {"prompt_tokens": "seven"}}
    assert count_whole_answer({"prompt": "x" * 8}, json.dumps(answer).encode()) == (2, 1, True)


def test_an_answer_that_is_not_json_counts_the_prompt_only():
    assert count_whole_answer({"input": ["abcd", "efgh", 3]}, b"<html>oops") == (2, 0, True)


def test_chat_content_parts_and_usage_shapes():
    payload = {"messages": [{"content": [{"type": "text", "text": "x" * 12}, "junk"]}]}
    assert estimate_prompt_tokens(payload) == 3
    assert usage_counts({"prompt_tokens": 5}) == (5, 0)
    assert usage_counts(None) is None
