"""Tool calls read back from the reply formats of the GGUF model families, and the schema
that forces a call."""

import json

import jsonschema
import pytest

from gpuq.jobs.tool_calls import ToolCall, forced_schema, parse, with_calls

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
TOOLS = [WEATHER, TIME]
PARIS = ToolCall("get_weather", {"city": "Paris"})


@pytest.mark.parametrize(
    ("reply", "content", "calls"),
    [
        # Hermes and Qwen: after optional text, one or more tags
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', None, [PARIS]),
        (
            'Let me look.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
            '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
            "Let me look.",
            [PARIS, ToolCall("get_time", {})],
        ),
        ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}', None, [PARIS]),  # cut before its end tag
        # Llama 3.x: "parameters", the python tag being a special token absent from the text
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [PARIS]),
        ('{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}', None, [PARIS]),
        # Mistral: the marker then an array
        ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]', None, [PARIS]),
        ('[{"name": "get_weather", "arguments": {"city": "Paris"}}]', None, [PARIS]),
        # Plain JSON, fenced, arguments as a JSON string (as OpenAI writes them)
        ('```json\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n```', None, [PARIS]),
        # Not calls: an answer that is JSON, an unknown function, broken JSON
        ('{"city": "Paris"}', '{"city": "Paris"}', []),
        ('{"name": "launch", "arguments": {}}', '{"name": "launch", "arguments": {}}', []),
        ('<tool_call>{"name": "get_weather", "arguments": {</tool_call>', None, []),
        ("It is sunny in Paris.", "It is sunny in Paris.", []),
    ],
)
def test_a_reply_in_each_familys_format_gives_its_calls(reply, content, calls):
    got_content, got_calls = parse(reply, TOOLS)
    assert got_calls == calls
    if calls or content is not None:
        assert got_content == (content if calls else reply)


TIME_CALL = '{"name": "get_time", "arguments": {}}'
PARIS_CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.mark.parametrize(
    ("reply", "content"),
    [
        (f"Let me look.\n<tool_call>{PARIS_CALL}</tool_call>\n<tool_call>{TIME_CALL}</tool_call>", "Let me look."),
        (f"[TOOL_CALLS] [{PARIS_CALL}, {TIME_CALL}]", None),
        (f"[{PARIS_CALL}, {TIME_CALL}]", None),
    ],
)
def test_a_request_that_wants_no_parallel_calls_reads_only_the_first(reply, content):
    assert parse(reply, TOOLS) == (content, [PARIS, ToolCall("get_time", {})])
    assert parse(reply, TOOLS, parallel=False) == (content, [PARIS])
    # As the jobs API shows a finished job: each sample's calls, as its request asked.
    request = {"messages": [], "tools": TOOLS, "parallel_tool_calls": False}
    shown = with_calls(request, {"text": reply, "choices": [{"text": reply}]})
    assert shown is not None and shown["tool_calls"] == shown["choices"][0]["tool_calls"]
    assert shown["tool_calls"] == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    several = with_calls({**request, "parallel_tool_calls": True}, {"text": reply})
    assert several is not None and len(several["tool_calls"]) == 2


def test_required_is_a_call_of_any_tool_and_a_named_choice_only_that_one():
    required = forced_schema(TOOLS, "required")
    assert required is not None
    jsonschema.validate({"name": "get_time", "arguments": {}}, required)
    jsonschema.validate({"name": "get_weather", "arguments": {"city": "Oslo"}}, required)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_weather", "arguments": {}}, required)  # its required argument

    named = forced_schema(TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    assert named is not None
    jsonschema.validate({"name": "get_weather", "arguments": {"city": "Oslo"}}, named)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_time", "arguments": {}}, named)
    assert forced_schema(TOOLS, "auto") is None
    # What a forced reply looks like is what parse reads.
    assert parse(json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}}), TOOLS)[1] == [
        ToolCall("get_weather", {"city": "Oslo"})
    ]
