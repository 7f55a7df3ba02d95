"""A completion's text, token by token, with create_completion's end rules."""

from worker.decoding.text import HELD, CompletionText


def feed(text: CompletionText, pieces: list[bytes]) -> list[int | None]:
    return [text.append(p) for p in pieces]


def test_a_stop_string_cuts_the_text_where_it_begins_even_across_tokens():
    text = CompletionText.with_stops(["END", "\n\n"])
    assert feed(text, [b"one ", b"two E", b"N"]) == [None, None, None]
    assert text.matched is None
    assert text.append(b"D three") == len(b"one two ")
    assert text.matched == "END"  # which one cut it: Anthropic's answer names it


def test_the_first_stop_string_of_the_list_wins():
    text = CompletionText.with_stops(["b", "a"])
    assert text.append(b"xab") == 2  # "b" is first in the list, though "a" comes first in the text
    assert text.matched == "b"


def test_checks_wait_while_the_text_ends_inside_a_utf8_character():
    euro = "€".encode()  # three bytes
    text = CompletionText.with_stops(["€"])
    assert text.append(b"cost: " + euro[:1]) == HELD
    assert text.append(euro[1:2]) == HELD
    assert text.append(euro[2:]) == len(b"cost: ")  # whole now: the stop string is found


def test_a_stream_never_shows_what_a_stop_string_may_still_cut_off():
    text = CompletionText.with_stops(["STOP"])
    text.append(b"go ST")
    assert text.take(text.sendable()) == "go "
    text.append(b"ill")
    assert text.take(text.sendable()) == "STill"


def test_the_cost_of_a_token_does_not_grow_with_the_text():
    """Only the bytes where a stop string can newly end are searched: a stop string that lies
    wholly in text searched before cannot be found again (it would have ended the text)."""
    text = CompletionText.with_stops(["zz"])
    text.data += b"zz"  # as if it had been searched already
    text._checked = 2
    assert text.append(b"a") is None
