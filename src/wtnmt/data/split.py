"""A seeded split for corpora without a standard one, by unique pivot sentence.

Tatoeba gives one English sentence several translations. Splitting pairs at random would put
"I'm hungry." in the test set with one German translation and in training with another, so
the split is made over *unique pivot sentences* (English for Tatoeba; the source side for a
user's own files): every translation of a dev or test sentence stays out of training.

Dev and test keep one pair per pivot sentence (the first translation in file order), so each
test source is scored once; their other translations are dropped and counted, never trained on.
"""

from __future__ import annotations

import random
from collections import Counter

from wtnmt.data.io import DataError

Pair = tuple[str, str]


def keep_short(pairs: list[Pair], max_words: int) -> tuple[list[Pair], int]:
    """Pairs whose two sides have at most ``max_words`` whitespace-separated words."""
    kept = [p for p in pairs if len(p[0].split()) <= max_words and len(p[1].split()) <= max_words]
    return kept, len(pairs) - len(kept)


def split_by_pivot(
    pairs: list[Pair],
    *,
    pivot: int,
    seed: int,
    valid_size: int,
    test_size: int,
    train_size: int | None = None,
) -> tuple[dict[str, list[Pair]], Counter[str]]:
    """Split ``pairs`` by unique pivot sentence (``pivot`` = 0 source side, 1 target side).

    Returns the splits {"train", "valid", "test"} and the dropped counts by reason.
    """
    groups: dict[str, list[Pair]] = {}
    for pair in pairs:
        groups.setdefault(pair[pivot], []).append(pair)
    keys = sorted(groups)  # a fixed order, whatever the file order, before the seeded shuffle
    random.Random(seed).shuffle(keys)
    if valid_size + test_size >= len(keys):
        raise DataError(
            f"cannot hold out {valid_size} dev + {test_size} test sentences: the corpus has "
            f"only {len(keys)} unique sentences on its pivot side; lower data.valid_size and "
            "data.test_size, or give dev and test files"
        )
    dropped: Counter[str] = Counter()
    valid_keys, test_keys = keys[:valid_size], keys[valid_size : valid_size + test_size]
    splits: dict[str, list[Pair]] = {"valid": [], "test": []}
    for name, chosen in (("valid", valid_keys), ("test", test_keys)):
        for key in chosen:
            splits[name].append(groups[key][0])
            dropped["other_translation_of_held_out"] += len(groups[key]) - 1
    train: list[Pair] = []
    for key in keys[valid_size + test_size :]:
        train.extend(groups[key])
    if train_size is not None and len(train) > train_size:
        dropped["over_train_size"] += len(train) - train_size
        train = train[:train_size]
    splits["train"] = train
    return splits, dropped
