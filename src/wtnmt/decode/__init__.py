"""Decoding: greedy and beam search, and the Translator that turns a run into translations."""

from wtnmt.decode.search import Hypothesis, beam_search, greedy_search, length_penalty

__all__ = ["Hypothesis", "beam_search", "greedy_search", "length_penalty"]
