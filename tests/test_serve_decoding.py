"""`wtnmt serve`'s decoding options beside the search: sampling (each request's samples equal
the Translator's under the same seed, batched with other requests or not) and a forced target
prefix a sentence (each sentence its own, in shared batches), with their bounds (422 naming
the field)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from helpers import sentence
from serving import shared_tiny_run
from wtnmt import Translator
from wtnmt.decode.sampling import Sampling
from wtnmt.serve.app import create_app
from wtnmt.serve.settings import ServeSettings

SENTENCES = [sentence(40_000 + i, 2 + i % 4) for i in range(6)]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return shared_tiny_run(tmp_path_factory)


@pytest.fixture(scope="module")
def translator(run_dir) -> Translator:
    return Translator.load(run_dir)


@pytest.fixture(scope="module")
def client(run_dir):
    app = create_app(
        Translator.load(run_dir), ServeSettings(max_sentences=4, max_chars=60, max_beam=6)
    )
    with TestClient(app) as c:
        yield c


def test_sampled_translations_equal_the_translators(client, translator):
    lines = SENTENCES[:3]
    sampling = {"temperature": 1.3, "top_k": 12, "seed": 5, "samples": 3}
    got = client.post("/v1/translate", json={"text": lines, "sampling": sampling}).json()
    want = translator.translate_nbest(lines, sampling=Sampling(**sampling))
    assert got["translations"] == [s[0].text for s in want]
    assert [[c["text"] for c in s] for s in got["nbest"]] == [[t.text for t in s] for s in want]
    # one sentence at a time, as another batch: the same samples
    alone = client.post("/v1/translate", json={"text": lines[1], "sampling": sampling}).json()
    assert [c["text"] for c in alone["nbest"][0]] == [t.text for t in want[1]]
    one = client.post("/v1/translate", json={"text": lines, "sampling": {"seed": 5}}).json()
    assert "nbest" not in one and len(one["translations"]) == 3


def test_each_sentence_gets_its_own_prefix(client, translator):
    lines = SENTENCES[:3]
    prefixes = ["AHPLA", "", "ATEB ATLED"]
    got = client.post("/v1/translate", json={"text": lines, "prefix": prefixes, "beam": 2}).json()
    want = translator.translate(lines, beam=2, prefixes=prefixes)
    assert got["translations"] == want
    assert want[0].startswith("AHPLA") and want[2].startswith("ATEB ATLED")
    single = client.post("/v1/translate", json={"text": lines[0], "prefix": "AHPLA"}).json()
    assert single["translations"] == translator.translate(lines[:1], prefixes=["AHPLA"])


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"sampling": {"samples": 7}}, "sampling.samples", "1 to 6"),
        ({"sampling": {}, "beam": 2}, "beam", "sampling draws each token"),
        ({"sampling": {}, "nbest": 2}, "nbest", "sampling draws each token"),
        ({"prefix": ["a", "b"]}, "prefix", "2 entries for 1 sentences"),
        ({"prefix": "x" * 61}, "prefix", "prefix[0] has 61 characters"),
    ],
)
def test_bad_decoding_options_are_422_naming_the_field(client, body, field, words):
    response = client.post("/v1/translate", json={"text": "alpha", **body})
    assert response.status_code == 422, response.text
    answer = response.json()
    assert answer["field"] == field and words in answer["detail"], answer


@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 0}, {"top_p": 0}, {"top_p": 1.5}, {"top_k": -1}, {"seed": -1}, {"x": 1}],
)
def test_sampling_values_out_of_their_bounds_are_422(client, sampling):
    response = client.post("/v1/translate", json={"text": "alpha", "sampling": sampling})
    assert response.status_code == 422, response.text


def test_alignments_equal_the_translators(client, translator):
    from wtnmt.decode.alignment import AlignmentSource

    lines = [SENTENCES[0], "", SENTENCES[2]]
    for level in ("words", "pieces"):
        got = client.post("/v1/translate", json={"text": lines, "alignment": level}).json()
        found = translator.translate_nbest(lines)
        want = translator.alignments(lines, [f[0] for f in found], AlignmentSource(level=level))
        assert got["alignments"] == [[list(p) for p in links] for links in want]
        assert got["alignments"][1] == [] and got["alignments"][0]
    plain = client.post("/v1/translate", json={"text": lines}).json()
    assert "alignments" not in plain
    bad = client.post("/v1/translate", json={"text": "alpha", "alignment": "letters"})
    assert bad.status_code == 422
