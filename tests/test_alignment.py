"""Alignments from the cross-attention (`translate --alignment`, ``Translator.alignments``,
``alignment`` in a server request): each output piece linked to the source piece its chosen
layer's heads attend to most (branches weighted by κ), words merged from pieces, in Moses'
``i-j`` format; against a reference that averages the maps by hand."""

from __future__ import annotations

import pytest
import torch

from helpers import one_line, train_tiny
from wtnmt import Translator
from wtnmt.cli import main as cli
from wtnmt.decode.alignment import (
    AlignmentSource,
    format_links,
    piece_links,
    word_links,
    word_starts,
)
from wtnmt.decode.attention import LayerAttention, cross_attention


def test_links_follow_the_weighted_average_of_the_maps():
    # 2 branches, 3 outputs + EOS row, 2 source pieces + EOS column
    maps = torch.tensor(
        [
            [[0.6, 0.3, 0.1], [0.1, 0.8, 0.1], [0.5, 0.4, 0.1], [0.0, 0.0, 1.0]],
            [[0.1, 0.8, 0.1], [0.7, 0.2, 0.1], [0.1, 0.15, 0.75], [0.0, 0.0, 1.0]],
        ]
    )
    equal = LayerAttention(maps, kappa=None, alpha=None)
    assert piece_links(equal, AlignmentSource().weights(equal)) == [(1, 0), (1, 1), (0, 2)]
    leaning = LayerAttention(maps, kappa=[0.9, 0.1], alpha=[0.5, 0.5])
    assert piece_links(leaning, AlignmentSource().weights(leaning)) == [(0, 0), (1, 1), (0, 2)]
    second = AlignmentSource(heads=(2,))
    assert piece_links(equal, second.weights(equal)) == [(1, 0), (0, 1), (1, 2)]  # EOS never
    with pytest.raises(ValueError, match="alignment head 3: this layer's are 1 to 2"):
        AlignmentSource(heads=(3,)).weights(equal)


def test_words_merge_their_pieces_links():
    source = ["▁Das", "▁Haus", "chen", "▁ist"]
    output = ["▁The", "▁little", "▁house", "▁is"]
    assert word_starts(source) == [0, 1, 1, 2]
    links = [(0, 0), (2, 1), (1, 2), (3, 3)]
    assert word_links(links, source, output) == [(0, 0), (1, 1), (1, 2), (2, 3)]
    assert format_links([(0, 0), (2, 1)]) == "0-0 2-1"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):  # type: ignore[no-untyped-def]
    return train_tiny(tmp_path_factory.mktemp("alignment"), max_steps=30)


def _reference(translator, sentence: str, output: list[int], layer: int, heads) -> list:  # type: ignore[no-untyped-def]
    """The averaged map's argmax, computed in plain Python from the model's maps."""
    source = translator.vocab.source.encode([sentence])[0]
    attention = cross_attention(translator.model, [source], [output], device=translator.device)
    maps = attention[0][layer]
    m = maps.maps.size(0)
    chosen = heads or list(range(1, m + 1))
    weight = {h: 1.0 if maps.kappa is None else maps.kappa[h - 1] for h in chosen}
    links = []
    for t in range(len(output)):
        scores = [
            sum(weight[h] * float(maps.maps[h - 1, t, s]) for h in chosen)
            for s in range(len(source))
        ]
        links.append((scores.index(max(scores)), t))
    return links


@pytest.mark.parametrize(("layer", "heads"), [(None, None), (1, (2, 4)), (0, (3,))])
def test_the_translators_alignments_equal_the_reference(run_dir, layer, heads):
    t = Translator.load(run_dir)
    sentences = ["alpha beta gamma", "delta epsilon", "zeta eta theta iota"]
    found = t.translate_nbest(sentences, beam=2)
    how = AlignmentSource(layer=layer, heads=heads, level="pieces")
    links = t.alignments(sentences, [f[0] for f in found], how)
    read = how.layer_of(len(t.model.decoder_layers))
    assert read == (0 if layer is None else layer)  # two layers: the penultimate is 0
    for sentence, options, mine in zip(sentences, found, links, strict=True):
        output = list(options[0].ids)
        assert len(mine) == len(output) > 0
        assert mine == _reference(t, sentence, output, read, heads)


def test_translate_writes_alignments_after_each_line(run_dir, tmp_path, capsys):
    text = tmp_path / "in.txt"
    text.write_text("alpha beta\n\ngamma delta\n")
    out = tmp_path / "out.txt"
    args = ["translate", str(run_dir), "-i", str(text), "-o", str(out), "--beam", "2"]
    assert cli([*args, "--alignment"]) == 0
    assert (
        "alignments (words) from the cross-attention of decoder layer 0" in capsys.readouterr().err
    )
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and all(" ||| " in line for line in lines)
    assert lines[1] == " ||| "  # an empty line: no translation, no links
    t = Translator.load(run_dir)
    found = t.translate_nbest(["alpha beta"], beam=2)
    want = format_links(t.alignments(["alpha beta"], [found[0][0]])[0])
    assert lines[0] == f"{found[0][0].text} ||| {want}"
    assert cli([*args, "--alignment", "pieces", "--nbest", "2"]) == 0
    nbest = out.read_text().splitlines()
    assert len(nbest) == 6 and all(line.count(" ||| ") == 3 for line in nbest)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--alignment-layer", "0"], "--alignment-layer reads alignments: add --alignment"),
        (["--alignment", "--alignment-layer", "5"], "alignment layer 5: the decoder's layers"),
        (["--alignment", "--alignment-heads", "7"], "head 7: layer 0's are 1 to 4"),
        (["--alignment", "--alignment-heads", "a"], "head numbers from 1"),
    ],
)
def test_alignment_options_are_checked_in_one_line(run_dir, tmp_path, capsys, args, message):
    text = tmp_path / "in.txt"
    text.write_text("alpha\n")
    assert cli(["translate", str(run_dir), "-i", str(text), *args]) == 2
    one_line(capsys, "translate", message)
