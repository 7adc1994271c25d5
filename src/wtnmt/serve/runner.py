"""What the model worker does with one batch: search, branch weights, attention maps.

Every sentence of a batch shares one ``Search`` (the batcher only groups equal ones), so the
branch-weight override of paper Table 3 (uniform or random κ, α, everywhere or in the named
sublayers alone) is switched on around the batch and the learned weights are back before the
next one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from wtnmt.decode.alignment import AlignmentSource, align
from wtnmt.decode.sampling import Sampling
from wtnmt.decode.translator import Translation, Translator
from wtnmt.model import branch_weights_overridden
from wtnmt.serve.metrics import Metrics

BranchMode = Literal["learned", "uniform", "random"]


@dataclass(frozen=True)
class Search:
    """How a request wants its sentences translated: the batching key."""

    beam: int
    nbest: int
    branch_weights: BranchMode = "learned"
    seed: int = 0  # of random branch weights
    only: tuple[str, ...] | None = None  # the sublayers whose κ, α are replaced (None: all)
    sampling: Sampling | None = None  # drawn rather than searched (nbest: the samples)


@dataclass(frozen=True)
class RequestPayload:
    search: Search
    attention: bool
    prefix: tuple[int, ...] = ()  # the sentence's forced target prefix (piece ids)
    alignment: str | None = None  # "words" or "pieces": the best translation's alignment


@dataclass(frozen=True)
class SentenceResult:
    options: list[Translation]  # n-best, best first
    attention: dict[str, Any] | None  # JSON-ready maps, when the request asked for them
    alignment: list[list[int]] | None = None  # [source, output] pairs, when asked for


class ModelRunner:
    def __init__(self, translator: Translator, metrics: Metrics, *, batch_tokens: int) -> None:
        self.translator = translator
        self.metrics = metrics
        self.batch_tokens = batch_tokens

    def __call__(
        self, ids: list[list[int]], payloads: list[RequestPayload]
    ) -> list[SentenceResult]:
        search = payloads[0].search
        assert all(p.search == search for p in payloads), "the batcher mixed searches"
        t = self.translator
        with branch_weights_overridden(
            t.model, search.branch_weights, seed=search.seed, only=search.only
        ):
            forced = [list(p.prefix) for p in payloads]
            outputs = t.translate_ids(
                ids,
                beam=search.beam,
                nbest=search.nbest,
                batch_tokens=self.batch_tokens,
                prefixes=forced if any(forced) else None,
                sampling=search.sampling,
            )
            wanted = [i for i, p in enumerate(payloads) if p.attention and ids[i]]
            maps = t.cross_attention(
                [ids[i] for i in wanted], [list(outputs[i][0].ids) for i in wanted]
            )
            links = self._alignments(ids, outputs, payloads)  # under the same κ, α
        attention: dict[int, dict[str, Any]] = {
            i: self._attention_json(ids[i], outputs[i][0].ids, layers)
            for i, layers in zip(wanted, maps, strict=True)
        }
        self.metrics.tokens.labels(side="source").inc(sum(map(len, ids)))
        self.metrics.tokens.labels(side="target").inc(sum(len(o[0].ids) for o in outputs))
        return [SentenceResult(outputs[i], attention.get(i), links.get(i)) for i in range(len(ids))]

    def _alignments(self, ids, outputs, payloads) -> dict[int, list[list[int]]]:  # type: ignore[no-untyped-def]
        """The alignment of each sentence's best translation that its request asked for."""
        found: dict[int, list[list[int]]] = {}
        for level in ("words", "pieces"):
            wanted = [i for i, p in enumerate(payloads) if p.alignment == level]
            if not wanted:
                continue
            t = self.translator
            links = align(
                t.model,
                t.vocab,
                [ids[i] for i in wanted],
                [list(outputs[i][0].ids) for i in wanted],
                AlignmentSource(level=level),
                device=t.device,
            )
            for i, pairs in zip(wanted, links, strict=True):
                found[i] = [list(p) for p in pairs]
        return found

    def _attention_json(self, src: list[int], out: tuple[int, ...], layers) -> dict[str, Any]:  # type: ignore[no-untyped-def]
        t = self.translator
        return {
            "source": [*t.pieces(src, source=True), "</s>"],
            "target": [*t.pieces(out), "</s>"],
            "layers": [
                {
                    "layer": n,
                    "kappa": layer.kappa,
                    "alpha": layer.alpha,
                    "branches": t.config.model.branch_numbers("decoder", n),
                    # [M][T][S]: branch (head) m, output token t, source token s
                    "maps": [
                        [[round(p, 4) for p in row] for row in m] for m in layer.maps.tolist()
                    ],
                }
                for n, layer in enumerate(layers)
            ],
        }

    def warmup(self) -> None:
        """One translation before the server calls itself ready (first calls are slow)."""
        t = self.translator
        t.translate_ids(t.encode(["Hello, world."]), beam=t.config.decode.beam)


__all__ = ["ModelRunner", "RequestPayload", "Search", "SentenceResult"]
