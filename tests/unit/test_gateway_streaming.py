"""SSE framing: forward whole events only, byte-identical overall; usage found or counted."""

from __future__ import annotations

import json

from coral_hpc.gateway.streaming import SSEFramer, StreamUsage, error_event

STREAM = (b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
          b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
          b'data: {"choices":[{"index":0,"delta":{"content":"lo"}}]}\r\n\r\n'
          b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
          b'data: [DONE]\n\n')


def test_any_chunking_forwards_whole_events_and_the_same_bytes():
    for size in (1, 2, 3, 7, 50, len(STREAM)):
        framer = SSEFramer()
        out = []
        for i in range(0, len(STREAM), size):
            block = framer.feed(STREAM[i:i + size])
            if block:
                assert block.endswith((b"\n\n", b"\r\n\r\n"))   # never half an event
                out.append(block)
        assert framer.pending == b""
        assert b"".join(out) == STREAM


def test_usage_from_the_stream_wins_and_chunks_are_counted_without_it():
    with_usage = StreamUsage(count_chunks=False)
    with_usage.observe(STREAM)
    assert with_usage.usage == {"prompt_tokens": 5, "completion_tokens": 2}
    counted = StreamUsage(count_chunks=True)
    counted.observe(STREAM.replace(b'"usage"', b'"other"'))
    assert counted.usage is None and counted.chunks == 2   # the empty role chunk is not a token


def test_error_event_is_an_openai_error_object():
    event = error_event("replica died", 502)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert json.loads(event[6:])["error"]["message"] == "replica died"
