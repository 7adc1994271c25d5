"""`wtnmt serve`, the API: translations, attention, branch weights, a full queue and a failed
translation, batching across requests, metrics (each bad request's named error and the limits:
test_serve_limits.py; the command itself: test_serve_command.py)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from helpers import sentence
from serving import LiveServer, metric, shared_tiny_run, train_tiny_run
from wtnmt import Translator
from wtnmt.cli import main as cli
from wtnmt.model import BranchWeights, branch_weight_table, count_parameters
from wtnmt.serve.app import create_app
from wtnmt.serve.settings import ServeSettings

SENTENCES = [sentence(40_000 + i, 2 + i % 4) for i in range(12)]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return shared_tiny_run(tmp_path_factory)


@pytest.fixture(scope="module")
def translator(run_dir) -> Translator:
    return Translator.load(run_dir)


def serve(run_dir: Path, **settings) -> TestClient:  # type: ignore[no-untyped-def]
    """A test client whose lifespan (worker, warm-up) runs inside ``with``."""
    return TestClient(create_app(Translator.load(run_dir), ServeSettings(**settings)))


@pytest.fixture(scope="module")
def client(run_dir):
    with serve(run_dir, max_sentences=4, max_chars=60, max_beam=6) as c:
        yield c


def test_health_ready_and_model(client, translator):
    assert client.get("/health").json() == {"status": "ok"}
    deadline = time.monotonic() + 30
    while (ready := client.get("/ready")).status_code == 503:  # warming up
        assert ready.json() == {"status": "loading"} and time.monotonic() < deadline
        time.sleep(0.05)
    assert ready.json() == {"status": "ready"}
    info = client.get("/v1/model").json()
    assert info["parameters"] == count_parameters(translator.model)
    assert info["quantize"] == "none" and info["int8_kernels"] is info["int8_weight_bits"] is None
    assert info["vocabulary_size"] == len(translator.vocab.target) == 60
    assert (info["source_language"], info["target_language"]) == ("xx", "yy")
    assert info["architecture"] == "weighted-transformer"
    assert info["config"]["model"]["d_model"] == 64 and info["config"]["decode"]["beam"] == 4
    table = branch_weight_table(translator.model)
    assert {
        w["layer"]: {"kappa": w["kappa"], "alpha": w["alpha"]} for w in info["branch_weights"]
    } == table
    assert info["limits"]["max_sentences"] == 4 and info["defaults"]["beam"] == 4


def test_translations_come_in_input_order_and_equal_the_translator(client, translator):
    lines = [SENTENCES[0], "", SENTENCES[1], SENTENCES[2]]
    got = client.post("/v1/translate", json={"text": lines, "beam": 3, "nbest": 2}).json()
    expected = translator.translate_nbest(lines, beam=3, nbest=2)
    assert got["translations"] == [options[0].text for options in expected]
    for mine, theirs in zip(got["nbest"], expected, strict=True):
        assert len(mine) == 2  # exactly nbest, as the command line writes: fillers after
        assert [c["text"] for c in mine[: len(theirs)]] == [t.text for t in theirs]
        found = [c["score"] for c in mine[: len(theirs)]]
        assert found == pytest.approx([t.score for t in theirs], abs=1e-4)
        assert mine[len(theirs) :] == [{"text": "", "score": None}] * (2 - len(theirs))
    # the scores tell the sentences apart (the tiny model's texts repeat): a mix-up would show
    assert len({tuple(c["score"] for c in mine) for mine in got["nbest"]}) == 4
    one = client.post("/v1/translate", json={"text": SENTENCES[3], "beam": 1}).json()
    assert one == {"translations": translator.translate([SENTENCES[3]], beam=1)}


def test_translations_equal_wtnmt_translate(client, run_dir, tmp_path):
    (tmp_path / "in.txt").write_text("".join(s + "\n" for s in SENTENCES[:4]))
    assert (
        cli(
            [
                "translate",
                str(run_dir),
                "-i",
                str(tmp_path / "in.txt"),
                "-o",
                str(tmp_path / "out.txt"),
            ]
        )
        == 0
    )
    served = client.post("/v1/translate", json={"text": SENTENCES[:4]}).json()["translations"]
    assert served == (tmp_path / "out.txt").read_text().splitlines()


def test_attention_maps_per_branch_with_their_weights(client, translator):
    got = client.post("/v1/translate", json={"text": [SENTENCES[4], ""], "attention": True}).json()
    assert got["attention"][1] is None  # an empty sentence has none
    a = got["attention"][0]
    src_ids = translator.encode([SENTENCES[4]])[0]
    out = translator.translate_nbest([SENTENCES[4]])[0][0]
    assert a["source"] == [*translator.pieces(src_ids, source=True), "</s>"]
    assert a["target"] == [*translator.pieces(out.ids), "</s>"]
    table = branch_weight_table(translator.model)
    assert len(a["layers"]) == 2
    for n, layer in enumerate(a["layers"]):
        maps = torch.tensor(layer["maps"])  # [M, T, S]
        assert maps.shape == (4, len(a["target"]), len(a["source"]))
        assert torch.allclose(maps.sum(-1), torch.ones(4, len(a["target"])), atol=1e-3)
        assert layer["kappa"] == pytest.approx(table[f"decoder_layers.{n}.cross_attn"]["kappa"])
        assert layer["alpha"] == pytest.approx(table[f"decoder_layers.{n}.cross_attn"]["alpha"])


def test_replaced_branch_weights_translate_as_the_paper_table_and_come_back(run_dir, translator):
    learned = {n: p.clone() for n, p in translator.model.named_parameters() if "branch" in n}
    with serve(run_dir) as client:
        server_model = client.app.state.batcher._translate.translator.model
        before = client.post("/v1/translate", json={"text": SENTENCES[:6]}).json()
        uniform = client.post(
            "/v1/translate",
            json={"text": SENTENCES[:6], "branch_weights": "uniform", "attention": True},
        ).json()
        assert all(layer["kappa"] == [0.25] * 4 for layer in uniform["attention"][0]["layers"])
        random = client.post(
            "/v1/translate", json={"text": SENTENCES[:6], "branch_weights": "random", "seed": 3}
        ).json()
        after = client.post("/v1/translate", json={"text": SENTENCES[:6]}).json()
    for how, answer in (("uniform", uniform), ("random", random)):
        replaced = Translator.load(run_dir)
        replaced.set_branch_weights(how, seed=3)
        assert answer["translations"] == replaced.translate(SENTENCES[:6])
    assert after == before  # the learned weights are back, and so are their translations
    for name, param in server_model.named_parameters():
        if name in learned:
            assert torch.equal(param, learned[name])
    assert any(isinstance(m, BranchWeights) for m in server_model.modules())


def test_branch_weights_replaced_in_named_sublayers_alone(run_dir, client):
    """``branch_weights_in`` replaces κ, α in the sublayers it names (as /v1/model lists them)
    and nowhere else: the translations of a model replaced so by hand, the decoder's κ learned
    still; without uniform or random, or naming a sublayer the model lacks, it is refused."""
    names = [w["layer"] for w in client.get("/v1/model").json()["branch_weights"]]
    encoder = [n for n in names if n.startswith("encoder_layers.")]

    def kappas(answer):  # type: ignore[no-untyped-def]
        return [layer["kappa"] for layer in answer["attention"][0]["layers"]]

    learned = client.post("/v1/translate", json={"text": SENTENCES[:1], "attention": True})
    for how in ("uniform", "random"):
        body = {"text": SENTENCES[:4], "branch_weights": how, "seed": 4, "attention": True}
        answer = client.post("/v1/translate", json={**body, "branch_weights_in": encoder}).json()
        replaced = Translator.load(run_dir)
        replaced.set_branch_weights(how, seed=4, only=encoder)
        assert answer["translations"] == replaced.translate(SENTENCES[:4])
        assert kappas(answer) == kappas(learned.json())  # the decoder's are the learned ones
        everywhere = client.post("/v1/translate", json=body).json()
        assert kappas(everywhere) != kappas(learned.json())
    for body, detail in (
        (
            {"branch_weights_in": encoder},
            "branch_weights_in: names the sublayers whose κ, α branch_weights replaces; ask "
            "for branch_weights 'uniform' or 'random' with it",
        ),
        (
            {"branch_weights": "uniform", "branch_weights_in": ["encoder_layers.9.self_attn"]},
            "branch_weights_in: encoder_layers.9.self_attn: not a branched sublayer of this "
            f"model; it has {', '.join(names)}",
        ),
        (
            {"branch_weights": "uniform", "branch_weights_in": []},
            "branch_weights_in: List should have at least 1 item after validation, not 0 (got [])",
        ),
    ):
        r = client.post("/v1/translate", json={"text": "a", **body})
        assert r.status_code == 422
        assert r.json() == {"detail": detail, "field": "branch_weights_in"}


def test_queue_full_is_429_with_retry_after_and_waiting_too_long_is_503(run_dir):
    # without its lifespan the app's worker never starts: requests stay queued
    app = create_app(
        Translator.load(run_dir), ServeSettings(max_queue=2, max_sentences=2, timeout=0.5)
    )

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            loading = await c.get("/ready")  # no warm-up translation yet
            assert (loading.status_code, loading.json()) == (503, {"status": "loading"})
            waiting = asyncio.ensure_future(c.post("/v1/translate", json={"text": ["a", "b"]}))
            await asyncio.sleep(0.1)
            full = await c.post("/v1/translate", json={"text": "c"})
            late = await waiting
            return full, late, await c.get("/metrics")

    full, late, metrics = asyncio.run(main())
    assert full.status_code == 429 and full.headers["retry-after"] == "1"
    assert full.json() == {
        "detail": "queue full: 2 sentences waiting, limit 2; retry in 1 s",
        "limit": 2,
    }
    assert late.status_code == 503
    assert late.json() == {
        "detail": "no translation within the request timeout of 0.5 s",
        "limit": 0.5,
    }
    assert metric(metrics.text, "wtnmt_rejections_total", 'reason="queue_full"') == 1
    assert metric(metrics.text, "wtnmt_rejections_total", 'reason="timeout"') == 1
    assert metric(metrics.text, "wtnmt_dropped_sentences_total") == 2


def test_a_failed_translation_is_500_and_the_server_goes_on(run_dir, monkeypatch):
    with serve(run_dir) as client:
        translator = client.app.state.batcher._translate.translator
        original = translator.translate_ids
        monkeypatch.setattr(translator, "translate_ids", lambda *a, **k: 1 / 0)
        r = client.post("/v1/translate", json={"text": "alpha"})
        assert r.status_code == 500
        assert r.json() == {
            "detail": "translation failed (ZeroDivisionError); the server's log has the details"
        }
        monkeypatch.setattr(translator, "translate_ids", original)
        assert client.post("/v1/translate", json={"text": "alpha"}).status_code == 200


@pytest.mark.slow
def test_transformer_models_have_no_branch_weights_to_replace(tmp_path):
    with serve(train_tiny_run(tmp_path, attention="multihead")) as client:
        assert client.get("/v1/model").json()["branch_weights"] == []
        r = client.post("/v1/translate", json={"text": "a", "branch_weights": "uniform"})
        assert r.status_code == 422
        assert r.json() == {
            "detail": "branch_weights='uniform': this model has no branch weights "
            "(model.attention: multihead)",
            "field": "branch_weights",
        }
        layer = client.post("/v1/translate", json={"text": "a b", "attention": True}).json()[
            "attention"
        ][0]["layers"][0]
        assert layer["kappa"] is None and len(layer["maps"]) == 4  # heads, not branches


def test_api_key_and_cors(run_dir):
    with serve(run_dir, api_key="s3cret", cors_origin="http://app.example") as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = client.post("/v1/translate", json={"text": "a"}, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert r.json() == {
                "detail": "missing or wrong API key: send the header 'Authorization: Bearer KEY'"
            }
        assert (
            client.get("/metrics").status_code == 401 and client.get("/v1/model").status_code == 401
        )
        ok = {"Authorization": "Bearer s3cret"}
        assert client.post("/v1/translate", json={"text": "a"}, headers=ok).status_code == 200
        assert client.get("/health").status_code == 200 and client.get("/").status_code == 200
        preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST"}
        r = client.options("/v1/translate", headers=preflight)
        assert r.headers["access-control-allow-origin"] == "http://app.example"
        r = client.options("/v1/translate", headers={**preflight, "Origin": "http://other.example"})
        assert "access-control-allow-origin" not in r.headers
    with serve(run_dir) as client:  # CORS is off by default
        r = client.post(
            "/v1/translate", json={"text": "a"}, headers={"Origin": "http://app.example"}
        )
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_concurrent_requests_are_translated_in_shared_batches(run_dir, translator):
    app = create_app(Translator.load(run_dir), ServeSettings(batch_wait_ms=300))

    async def main(url):
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            answers = await asyncio.gather(
                *(c.post("/v1/translate", json={"text": [s], "nbest": 2}) for s in SENTENCES)
            )
            return [a.json() for a in answers], (await c.get("/metrics")).text

    with LiveServer(app) as server:
        answers, metrics = asyncio.run(main(server.url))
    expected = translator.translate_nbest(SENTENCES, nbest=2)
    assert [a["translations"] for a in answers] == [[e[0].text] for e in expected]
    scores = [tuple(c["score"] for c in a["nbest"][0]) for a in answers]
    assert len(set(scores)) == len(SENTENCES)  # each answer is its own sentence's
    for mine, theirs in zip(scores, expected, strict=True):
        assert mine == pytest.approx([t.score for t in theirs], abs=1e-4)
    # the warm-up translation goes around the queue, so these count the requests' batches only
    assert metric(metrics, "wtnmt_batch_sentences_sum") == len(SENTENCES)
    assert 1 <= metric(metrics, "wtnmt_batches_total") < len(SENTENCES) / 2
    assert metric(metrics, "wtnmt_batch_requests_sum") == len(
        SENTENCES
    )  # requests per batch, summed
    assert metric(metrics, "wtnmt_batch_sentences_bucket", 'le="1.0"') < metric(
        metrics, "wtnmt_batches_total"
    )


@pytest.mark.slow
def test_a_client_that_goes_away_has_its_queued_sentences_dropped(run_dir):
    # the oldest sentence waits 3 s for company: time enough to leave before it is batched
    app = create_app(Translator.load(run_dir), ServeSettings(batch_wait_ms=3000))
    with LiveServer(app) as server:
        body = json.dumps({"text": SENTENCES[:3]}).encode()
        with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1]))) as s:
            s.sendall(
                b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            time.sleep(0.3)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            metrics = httpx.get(server.url + "/metrics").text
            if metric(metrics, "wtnmt_dropped_sentences_total"):
                break
            time.sleep(0.05)
        time.sleep(3.2)  # past the batching window: nothing of it may be translated
        metrics = httpx.get(server.url + "/metrics").text
    assert metric(metrics, "wtnmt_dropped_sentences_total") == 3
    assert metric(metrics, "wtnmt_rejections_total", 'reason="disconnected"') == 1
    assert metric(metrics, "wtnmt_sentences_total") == 0
    assert metric(metrics, "wtnmt_queue_depth") == 0


def test_metrics_count_requests_sentences_tokens_and_latency(client):
    client.post("/v1/translate", json={"text": SENTENCES[:2]})
    client.post("/v1/translate", json={"text": 5})  # a 422, counted by its status
    text = client.get("/metrics").text
    assert metric(text, "wtnmt_requests_total", 'path="/v1/translate",status="200"') >= 1
    assert metric(text, "wtnmt_requests_total", 'path="/v1/translate",status="422"') >= 1
    assert metric(text, "wtnmt_sentences_total") >= 2
    assert metric(text, "wtnmt_tokens_total", 'side="source"') > 0
    assert metric(text, "wtnmt_tokens_total", 'side="target"') > 0
    assert metric(text, "wtnmt_request_seconds_count") >= 1
    assert metric(text, "wtnmt_queue_depth") == 0


def test_openapi_documents_the_api(client):
    spec = client.get("/openapi.json").json()
    assert {"/v1/translate", "/v1/model", "/health", "/ready", "/metrics"} <= set(spec["paths"])
    responses = spec["paths"]["/v1/translate"]["post"]["responses"]
    assert {"200", "401", "413", "422", "429", "503"} <= set(responses)
