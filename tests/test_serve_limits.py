"""The server's limits against what a client can send: each bad request and the error that
names it, bodies it cannot parse or too large, text that is not Unicode, out-of-range seeds,
attention maps too large to send, keys outside ASCII; and one rule for n-best lists with the
command line. (Slow and idle clients against the real server: test_serve_connections.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving import shared_tiny_run
from wtnmt import Translator
from wtnmt.cli import main as cli
from wtnmt.config import ConfigError
from wtnmt.serve.app import create_app
from wtnmt.serve.settings import ServeSettings

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return shared_tiny_run(tmp_path_factory)


@pytest.fixture(scope="module")
def translator(run_dir) -> Translator:
    return Translator.load(run_dir)


@pytest.fixture(scope="module")
def client(translator):
    app = create_app(translator, ServeSettings(max_attention_sentences=2))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="module")
def strict(translator):
    """A server with small limits on sentences, characters and beam, for the named errors."""
    with TestClient(
        create_app(translator, ServeSettings(max_sentences=4, max_chars=60, max_beam=6))
    ) as c:
        yield c


@pytest.mark.parametrize(
    ("body", "status", "detail", "extra"),
    [
        (
            {"text": ["a"] * 5},
            422,
            "text has 5 sentences; at most 4 are accepted per request",
            {"field": "text", "limit": 4},
        ),
        (
            {"text": ["a", "b" * 61]},
            422,
            "text[1] has 61 characters; at most 60 are accepted per sentence",
            {"field": "text", "index": 1, "limit": 60},
        ),
        (
            {"text": "a", "beam": 0},
            422,
            "beam=0 is out of range: 1 to 6",
            {"field": "beam", "limit": 6},
        ),
        (
            {"text": "a", "beam": 7},
            422,
            "beam=7 is out of range: 1 to 6",
            {"field": "beam", "limit": 6},
        ),
        (
            {"text": "a", "beam": 2, "nbest": 3},
            422,
            "nbest=3 is out of range: 1 to the beam size (2)",
            {"field": "nbest", "limit": 2},
        ),
        (
            {"text": "a", "nbest": 0},
            422,
            "nbest=0 is out of range: 1 to the beam size (4)",
            {"field": "nbest", "limit": 4},
        ),
        ({"text": 5}, 422, "text must be a string or a list of strings", {"field": "text"}),
        (
            {"text": ["a", 3]},
            422,
            "text must be a string or a list of strings; text[1] is not a string",
            {"field": "text", "index": 1},
        ),
        (
            {"text": "a", "beam": "5"},
            422,
            "beam: Input should be a valid integer (got '5')",
            {"field": "beam"},
        ),
        (
            {"text": "a", "attention": "yes"},
            422,
            "attention: Input should be a valid boolean (got 'yes')",
            {"field": "attention"},
        ),
        (
            {"text": "a", "branch_weights": "best"},
            422,
            "branch_weights: Input should be 'learned', 'uniform' or 'random' (got 'best')",
            {"field": "branch_weights"},
        ),
        (
            {"text": "a", "nbset": 2},
            422,
            "unknown field 'nbset'; the fields are: text, beam, nbest, branch_weights, "
            "branch_weights_in, seed, attention, prefix, alignment, sampling",
            {"field": "nbset"},
        ),
        ({"beam": 2}, 422, "the field 'text' is required", {"field": "text"}),
        ([1, 2], 422, 'the request body must be a JSON object such as {"text": "Hello."}', {}),
    ],
)
def test_every_bad_request_names_what_is_wrong(strict, body, status, detail, extra):
    r = strict.post("/v1/translate", json=body)
    assert (r.status_code, r.json()) == (status, {"detail": detail, **extra})


def test_bad_json_and_oversized_bodies(translator, strict):
    r = strict.post(
        "/v1/translate", content=b'{"text": "a",', headers={"content-type": "application/json"}
    )
    assert r.status_code == 422 and r.json()["detail"].startswith(
        "the request body is not valid JSON"
    )
    with TestClient(create_app(translator, ServeSettings(max_body_bytes=100))) as small:
        body = json.dumps({"text": "a" * 200}).encode()
        r = small.post("/v1/translate", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert r.json() == {
            "detail": f"request body has {len(body)} bytes; at most 100 are accepted",
            "limit": 100,
        }

        def chunks():  # no Content-Length: the limit is found while reading
            yield b'{"text": "'
            yield b"a" * 200
            yield b'"}'

        r = small.post(
            "/v1/translate", content=chunks(), headers={"content-type": "application/json"}
        )
        assert r.status_code == 413
        assert r.json() == {
            "detail": "request body has more bytes than that; at most 100 are accepted",
            "limit": 100,
        }
        assert small.get("/health").status_code == 200  # and the server is still there


@pytest.mark.parametrize(
    ("raw", "detail"),
    [
        (b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "(nested too deeply)"),
        (b'{"text": "caf\xe9"}', "(not UTF-8 text at byte 13)"),
        (b'{"text": "a", "seed": ' + b"7" * 5000 + b"}", "(an integer has too many digits)"),
    ],
)
def test_bodies_that_are_not_json_are_422_with_the_reason(client, raw, detail):
    r = client.post("/v1/translate", content=raw, headers=JSON)
    assert r.status_code == 422
    assert r.json() == {"detail": f"the request body is not valid JSON {detail}"}


def test_text_that_is_not_unicode_is_422_naming_the_sentence(client):
    r = client.post("/v1/translate", content=b'{"text": ["ok", "a\\ud800b"]}', headers=JSON)
    assert r.status_code == 422
    assert (r.json()["field"], r.json()["index"]) == ("text", 1)
    assert "lone surrogate" in r.json()["detail"]


@pytest.mark.parametrize("seed", [2**63, 2**70, -1])
def test_a_seed_out_of_range_is_422(client, seed):
    r = client.post("/v1/translate", json={"text": "a", "branch_weights": "random", "seed": seed})
    assert r.status_code == 422 and r.json()["field"] == "seed"
    ok = client.post(
        "/v1/translate", json={"text": "a", "branch_weights": "random", "seed": 2**63 - 1}
    )
    assert ok.status_code == 200


def test_attention_maps_are_bounded_before_decoding(client, translator):
    three = ["alpha beta", "gamma", "delta"]
    r = client.post("/v1/translate", json={"text": three, "attention": True})
    assert r.status_code == 422
    assert (r.json()["field"], r.json()["limit"]) == ("attention", 2)
    assert (
        client.post("/v1/translate", json={"text": three[:2], "attention": True}).status_code == 200
    )
    long = " ".join(["alpha"] * 150)  # 150 pieces or more: ~ 2·4·236·151 numbers
    r = client.post("/v1/translate", json={"text": [long, long], "attention": True})
    assert r.status_code == 422 and r.json()["limit"] == 500_000
    assert "could hold" in r.json()["detail"]
    assert client.post("/v1/translate", json={"text": [long, long]}).status_code == 200


def test_nbest_has_exactly_n_entries_as_on_the_command_line(client, run_dir, tmp_path, capsys):
    r = client.post("/v1/translate", json={"text": ["", "alpha beta"], "beam": 3, "nbest": 3})
    assert r.status_code == 200
    nbest = r.json()["nbest"]
    assert [len(n) for n in nbest] == [3, 3]
    assert nbest[0][0] == {"text": "", "score": 0.0}
    assert nbest[0][1:] == [{"text": "", "score": None}] * 2
    (tmp_path / "in.txt").write_text("\nalpha beta\n")
    assert cli(["translate", str(run_dir), "-i", str(tmp_path / "in.txt"), "--beam", "3",
                "--nbest", "3"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" ||| ")[0] for line in lines] == ["0"] * 3 + ["1"] * 3
    assert [line.endswith("-inf") for line in lines[:3]] == [False, True, True]


def test_a_key_outside_ascii_matches_its_utf8_form(translator):
    app = create_app(translator, ServeSettings(api_key="clé-ключ"))
    with TestClient(app) as c:
        good = {b"authorization": "Bearer clé-ключ".encode()}
        r = c.post(
            "/v1/translate",
            content=b'{"text": "a"}',
            headers={**good, b"content-type": b"application/json"},
        )
        assert r.status_code == 200, r.text
        wrong = {b"authorization": "Bearer cle-ключ".encode(), b"content-type": b"application/json"}
        assert c.post("/v1/translate", content=b'{"text": "a"}', headers=wrong).status_code == 401


def test_a_run_whose_beam_exceeds_max_beam_is_refused_at_start(translator, run_dir, capsys):
    with pytest.raises(ConfigError, match=r"decode\.beam=4 exceeds --max-beam 2"):
        create_app(translator, ServeSettings(max_beam=2))
    assert cli(["serve", str(run_dir), "--port", "0", "--max-beam", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exceeds --max-beam 2: raise --max-beam, or give --beam" in err


def test_a_host_that_does_not_resolve_is_one_line(run_dir, capsys):
    assert cli(["serve", str(run_dir), "--host", "foo.invalid", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wtnmt serve: error: cannot listen on foo.invalid:0: ")
    assert "Unknown error" not in err and err.count("\n") == 1


# any JSON value in any field, or any bytes at all: an answer, never a 500
FIELDS = [
    "text",
    "beam",
    "nbest",
    "branch_weights",
    "branch_weights_in",
    "seed",
    "attention",
    "other",
]
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=st.dictionaries(st.sampled_from(FIELDS), values, max_size=4))
def test_no_json_body_makes_the_server_fail(client, body):
    r = client.post("/v1/translate", content=json.dumps(body).encode(), headers=JSON)
    assert r.status_code in (200, 422), (body, r.status_code, r.text)
    assert "detail" in r.json() or "translations" in r.json()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=st.binary(max_size=60))
def test_no_bytes_make_the_server_fail(client, raw):
    r = client.post("/v1/translate", content=raw, headers=JSON)
    assert r.status_code in (200, 422), (raw, r.status_code, r.text)


def test_each_request_is_a_log_line(client, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="wtnmt.serve.requests"):
        assert client.post("/v1/translate", json={"text": "alpha"}).status_code == 200
        assert client.post("/v1/translate", json={"text": 3}).status_code == 422
    lines = [r.getMessage() for r in caplog.records if r.name == "wtnmt.serve.requests"]
    assert re.fullmatch(r"POST /v1/translate 200 \d+\.\d ms", lines[0]), lines
    assert lines[1].startswith("POST /v1/translate 422 ")
    assert all("alpha" not in line for line in lines)  # no text logged
