"""What `wtnmt prepare` reports: each split's counts and each step's seconds (summary.json)
and the table it prints."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

# each reason a training pair is dropped for, and the setting that drops it
FILTERS = {
    "over_max_words": "data.max_words",
    "over_train_size": "data.train_size",
    "other_translation_of_held_out": "the seeded split (another translation of a held-out "
    "sentence)",
    "empty": "an empty side",
    "duplicate": "data.drop_duplicates",
    "too_long": "data.max_tokens_per_side",
    "length_ratio": "data.max_length_ratio",
}


class StepClock:
    """Seconds of each step of a build."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, name: str) -> float:
        now = time.perf_counter()
        self.laps[name], self.last = round(now - self.last, 2), now
        return self.laps[name]


def dropped_reasons(dropped: Counter[str], corpus_level: dict[str, Any]) -> str:
    """The pairs dropped, a count a reason, for an error's line (``corpus_level``'s too)."""
    counts = Counter(corpus_level.get("dropped", {})) + dropped
    return ", ".join(f"{n:,} {reason.replace('_', ' ')}" for reason, n in counts.items() if n)


def corpus_counts(selection: Any) -> dict[str, Any]:
    """What make_splits reports for a source with its own splits, from the counts of the
    ``selection``'s first pass (train_split.Selection)."""
    if selection.corpus_dropped is None:
        return {}
    drops = sorted((k, v) for k, v in selection.corpus_dropped.items() if v)
    return {"pairs_read": selection.read, "dropped": dict(drops)}


def filters_applied(config: Any, counts: Counter[str]) -> list[dict[str, Any]]:
    """Every filter the training pairs went through (``config``: the DataConfig), with its
    setting and the pairs it dropped, zero included: what summary.json's ``filters`` holds."""
    settings = {
        "over_max_words": config.max_words,
        "over_train_size": config.train_size,
        "duplicate": config.drop_duplicates or None,
        "too_long": config.max_tokens_per_side,
        "length_ratio": config.max_length_ratio,
    }
    rows = []
    for reason, name in FILTERS.items():
        setting = settings.get(reason)
        if counts.get(reason) or setting is not None or reason == "empty":
            rows.append({"filter": name, "setting": setting, "dropped": counts.get(reason, 0)})
    return rows


def describe_filters(rows: list[dict[str, Any]]) -> str:
    """``filters_applied``'s rows in a log line: "12 by data.max_words=12, 0 by …"."""
    parts = []
    for row in rows:
        setting = row["setting"]
        named = row["filter"] + (f"={setting}" if setting not in (None, True) else "")
        parts.append(f"{row['dropped']:,} by {named}")
    return ", ".join(parts)


def split_stats(
    read: int, kept: int, dropped: Counter[str], tokens_src: int, tokens_tgt: int
) -> dict[str, Any]:
    n = max(kept, 1)
    return {
        "pairs_read": read,
        "pairs_kept": kept,
        "dropped": dict(sorted(dropped.items())),
        "tokens_src": tokens_src,
        "tokens_tgt": tokens_tgt,
        "avg_len_src": round(tokens_src / n, 2),
        "avg_len_tgt": round(tokens_tgt / n, 2),
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as the table `wtnmt prepare` prints."""
    reasons = sorted({r for s in summary["splits"].values() for r in s["dropped"]})
    head = ["split", "read", "kept", *reasons, "src tokens", "tgt tokens", "avg src", "avg tgt"]
    rows = [head]
    for name, s in summary["splits"].items():
        rows.append(
            [
                name,
                f"{s['pairs_read']:,}",
                f"{s['pairs_kept']:,}",
                *(f"{s['dropped'].get(r, 0):,}" for r in reasons),
                f"{s['tokens_src']:,}",
                f"{s['tokens_tgt']:,}",
                f"{s['avg_len_src']:.1f}",
                f"{s['avg_len_tgt']:.1f}",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        "  ".join(
            cell.rjust(w) if i else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    corpus = summary.get("corpus") or {}
    out = []
    if corpus:
        drops = ", ".join(f"{k} {v:,}" for k, v in corpus.get("dropped", {}).items())
        split = f"; {corpus['split']}" if corpus.get("split") else ""
        out.append(
            f"corpus: {corpus['pairs_read']:,} pairs read{split}"
            + (f"; dropped before splitting: {drops}" if drops else "")
        )
    out += lines
    pieces = f"{summary['vocab_size']:,} shared pieces"
    if "src_vocab_size" in summary:
        pieces = f"{summary['src_vocab_size']:,} source and {summary['vocab_size']:,} target pieces"
    out.append(
        f"vocabulary: {pieces}   "
        f"({summary['src_lang']}→{summary['tgt_lang']}, {summary['seconds']} s)"
    )
    out.append(f"data: {summary['attribution']}")
    return "\n".join(out)
