"""Prompt rendering and token counting in the API match what the worker's llama.cpp runs."""

import llama_cpp

from gpuq.jobs.prompt import VocabTokenizer, prompt_text

CHATS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo, wörld? 🙂"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c" * 300}],
]


def test_counts_equal_llama_cpps_own_tokenizer_on_the_rendered_prompt(model_path):
    vocab = VocabTokenizer(model_path)
    llm = llama_cpp.Llama(model_path=model_path, n_ctx=512, verbose=False)  # the worker's tokenizer
    for messages in CHATS:
        text = prompt_text({"messages": messages}, vocab.formatter)
        assert vocab.count_request_tokens({"messages": messages}) == len(llm.tokenize(text.encode(), True, True))
    llm.close()
    assert vocab.count_text_tokens("Say hi.") == 3


def test_the_byte_bound_of_a_chat_equals_the_rendered_length(model_path):
    vocab = VocabTokenizer(model_path)
    for messages in CHATS:
        rendered = prompt_text({"messages": messages}, vocab.formatter).encode()
        assert vocab.prompt_bytes({"messages": messages}) == len(rendered)
        assert vocab.count_request_tokens({"messages": messages}) <= len(rendered) + 2
    assert vocab.prompt_bytes({"prompt": "héllo"}) == 6
