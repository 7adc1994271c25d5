"""What `wtnmt prepare` reports: each split's counts (summary.json) and the table it prints."""

from __future__ import annotations

from collections import Counter
from typing import Any


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
        out.append(
            f"corpus: {corpus['pairs_read']:,} pairs read; {corpus['split']}"
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
