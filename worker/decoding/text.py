"""A completion's text, built one token at a time, with the end rules of ``create_completion``.

Each token's bytes are appended once, and stop strings are looked for only where they can
newly end, so the cost of a token does not grow with the length of the answer (before, the
whole completion was detokenised and rescanned at every token: 9 ms a sequence a step at
1,000 tokens, 23 ms at 2,000). The rules are llama-cpp-python's own: while the text ends
inside a UTF-8 character, the checks wait for the tokens it still needs; the first stop
string of the list that occurs cuts the text where it begins; text that could still become
a stop string is held back from a stream.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from dataclasses import dataclass, field

HELD = -1  # `append`'s answer while the checks wait for the rest of a UTF-8 character


@dataclass(slots=True)
class CompletionText:
    stops: list[bytes]
    data: bytearray = field(default_factory=bytearray)
    _checked: int = 0  # bytes already searched for stop strings
    _hold: int = 0  # tokens for which the checks still wait (the UTF-8 hold-back)
    # Streaming: bytes already handed out, decoded incrementally so pieces join to the text.
    sent: int = 0
    _utf8: codecs.IncrementalDecoder = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("ignore"))
    matched: str | None = None  # the stop string that cut the text (Anthropic's answer names it)

    @classmethod
    def with_stops(cls, stops: Iterable[str]) -> CompletionText:
        return cls([s.encode("utf-8") for s in stops if s])

    def append(self, piece: bytes) -> int | None:
        """Adds one token's bytes. Returns ``HELD`` while the text ends inside a UTF-8
        character (no check runs then, as in create_completion), the byte length the text is
        cut to when a stop string now occurs, or None."""
        self.data += piece
        self._hold = _utf8_tokens_missing(self.data) or self._hold
        if self._hold > 0:
            self._hold -= 1
            return HELD
        cut = self._stop_at()
        self._checked = len(self.data)
        return cut

    def _stop_at(self) -> int | None:
        # An occurrence lying wholly in the part searched before would have ended the text
        # then, so each stop string is looked for only from where it could newly end.
        for stop in self.stops:
            at = self.data.find(stop, max(0, self._checked - len(stop) + 1))
            if at >= 0:
                self.matched = stop.decode("utf-8", errors="replace")
                return at
        return None

    def sendable(self) -> int:
        """How many bytes may go to a stream now: all but a tail that could be the start of a
        stop string."""
        return len(self.data) - _stop_prefix(self.data, self.stops)

    def take(self, upto: int, *, final: bool = False) -> str:
        """The text from what was sent up to ``upto`` bytes, decoded incrementally."""
        upto = max(upto, self.sent)  # held-back text is the only text a stop string may cut
        chunk = self._utf8.decode(bytes(self.data[self.sent : upto]), final=final)
        self.sent = upto
        return chunk


def _utf8_tokens_missing(text: bytearray) -> int:
    """create_completion's count of the tokens a UTF-8 character cut at the text's end still
    needs (0 when the text ends on a whole character)."""
    missing = 0
    for k, char in enumerate(text[-3:]):
        k = 3 - k
        for num, pattern in ((2, 192), (3, 224), (4, 240)):
            if num > k and pattern & char == pattern:
                missing = num - k
    return missing


def _stop_prefix(text: bytearray, stops: list[bytes]) -> int:
    """How many bytes at the end of text could be the start of a stop string: held back."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest
