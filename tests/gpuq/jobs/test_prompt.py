"""Prompt rendering and token counting in the API match what the worker's llama.cpp runs."""

import llama_cpp

from gpuq.jobs.generation_params import GenerationParams
from gpuq.jobs.prompt import VocabTokenizer, prompt_text, unpack_prompt_ids, vocabulary_file_tag


def _request(**fields) -> GenerationParams:
    return GenerationParams.model_validate(fields)


CHATS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo, wörld? 🙂"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c" * 300}],
]


def test_counts_equal_llama_cpps_own_tokenizer_on_the_rendered_prompt(model_path):
    vocab = VocabTokenizer(model_path)
    llm = llama_cpp.Llama(model_path=model_path, n_ctx=512, verbose=False)  # the worker's tokenizer
    for messages in CHATS:
        text = prompt_text(_request(messages=messages), vocab.formatter)
        assert vocab.count_request_tokens(_request(messages=messages)) == len(llm.tokenize(text.encode(), True, True))
    llm.close()
    assert vocab.count_text_tokens("Say hi.") == 3


def test_the_byte_bound_of_a_chat_equals_the_rendered_length(model_path):
    vocab = VocabTokenizer(model_path)
    for messages in CHATS:
        rendered = prompt_text(_request(messages=messages), vocab.formatter).encode()
        assert vocab.prompt_bytes(_request(messages=messages)) == len(rendered)
        assert vocab.count_request_tokens(_request(messages=messages)) <= len(rendered) + 2
    assert vocab.prompt_bytes(_request(prompt="héllo")) == 6


LONG_CHATS = [
    [{"role": "user", "content": "lorem ipsum dolor sit amet, " * 40} for _ in range(30)],
    [{"role": "user", "content": "  🙂  " * 500}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": "x"}],
]


def test_the_fewest_tokens_judged_by_size_are_never_more_than_the_count(model_path):
    """The bound refuses without tokenising, so it must never refuse what fits."""
    vocab = VocabTokenizer(model_path)
    for messages in CHATS + LONG_CHATS:
        request = _request(messages=messages)
        assert vocab.fewest_tokens(request) <= vocab.count_request_tokens(request)
    words = _request(prompt="word " * 3000)
    assert vocab.fewest_tokens(words) <= vocab.count_request_tokens(words)
    flood = _request(messages=[{"role": "user", "content": f"hello there {i}"} for i in range(10_000)])
    assert vocab.fewest_tokens(flood) == 10_000  # one a message at least: over any context here


def test_a_long_prompt_is_judged_by_its_start_and_a_short_one_counted_exactly(model_path):
    vocab = VocabTokenizer(model_path)
    for messages in CHATS + LONG_CHATS:
        request = _request(messages=messages)
        whole = vocab.count_request_tokens(request)
        assert vocab.count_up_to(request, 10**6)[:2] == (whole, True)
        n, exact, _ = vocab.count_up_to(request, 2048)
        assert (n == whole) if exact else (2048 < n <= whole)
    long = _request(messages=[{"role": "user", "content": "lorem ipsum dolor sit amet " * 3} for _ in range(2_000)])
    whole = vocab.count_request_tokens(long)
    least, exact, ids = vocab.count_up_to(long, 2047)
    assert not exact and 2047 < least <= whole and ids is None  # refused: nothing to hand on


def test_the_tokens_counted_are_handed_on_as_the_workers_own(model_path):
    """The API tokenises a prompt once; the ids it keeps on the job row are the ones the
    worker's llama.cpp would make, and a worker with another model file ignores them."""
    vocab = VocabTokenizer(model_path)
    llm = llama_cpp.Llama(model_path=model_path, n_ctx=512, verbose=False)
    tag = vocabulary_file_tag(model_path)
    for messages in CHATS + LONG_CHATS:
        request = _request(messages=messages)
        counted = vocab.count_up_to(request, 10**6)
        text = prompt_text(request, vocab.formatter).encode()
        worker_tokens = llm.tokenize(text, True, True)
        assert counted.tokens == len(worker_tokens)
        assert unpack_prompt_ids(tag, counted.ids) == worker_tokens
        assert unpack_prompt_ids(b"elsewise", counted.ids) is None
    llm.close()
    given = _request(prompt_token_ids=[1, 2, 3])
    assert vocab.count_up_to(given, 100) == (3, True, None)  # the request carries them already


# A Hermes/Qwen-style template, cut down: it renders the tools, an assistant's calls (arguments
# through tojson, as templates write them) and tool results.
TOOL_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.arguments | tojson }}</tool_call>{% endfor %}"
    "</{{ m.role }}>\n{% endfor %}"
)
CONVERSATION = [
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}
        ],
    },
    {"role": "tool", "content": "-3C", "tool_call_id": "c1"},
]
WEATHER = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]


def test_a_template_that_renders_tools_gets_them_and_the_calls_arguments_as_objects():
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    formatter = Jinja2ChatFormatter(template=TOOL_TEMPLATE, eos_token="", bos_token="")
    text = prompt_text(_request(messages=CONVERSATION, tools=WEATHER), formatter)
    assert text == (
        "<tools>weather;</tools>\n<user>Weather in Oslo?</user>\n"
        '<assistant><tool_call>{"city": "Oslo"}</tool_call></assistant>\n<tool>-3C</tool>\n'
    )


def test_a_template_that_knows_no_tools_gets_them_described_and_earlier_calls_as_text(model_path):
    vocab = VocabTokenizer(model_path)  # SmolLM2's template renders only roles and contents
    request = _request(messages=CONVERSATION, tools=WEATHER)
    text = prompt_text(request, vocab.formatter)
    assert '{"name": "weather", "parameters": {"type": "object"}}' in text and "answer with only a JSON object" in text
    assert '<|im_start|>assistant\n{"name": "weather", "arguments": {"city": "Oslo"}}<|im_end|>' in text
    assert vocab.prompt_bytes(request) == len(text.encode())
