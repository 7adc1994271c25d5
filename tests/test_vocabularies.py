"""Separate source and target vocabularies (``data.joint_vocab: false``): prepare trains one
sentencepiece model a language and encodes each side with its own; the model gets a source
embedding of its own (the target's stays tied to the output projection); training, resume,
decoding, averaging, pruning and serving read the two from the run. The ONNX export of such a
model is tested with the other kinds (test_onnx.py KINDS)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import prepare_args, tiny_run_config
from wtnmt import Translator
from wtnmt.cli import main as cli
from wtnmt.config import load_config
from wtnmt.data import prepare
from wtnmt.data.vocab import Vocabulary
from wtnmt.errors import CheckpointError
from wtnmt.model import build_model
from wtnmt.train import Trainer

SOURCES = ["alpha beta gamma", "delta zeta eta theta", "iota"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny Weighted Transformer trained on separate vocabularies (the synthetic target is
    the source's words upper-cased and reversed: two alphabets, as two scripts would be)."""
    tmp = tmp_path_factory.mktemp("separate")
    config = tiny_run_config(
        tmp,
        data={"joint_vocab": False},
        model={"d_model": 32, "d_ff": 64, "heads": 4},
        train={"max_steps": 8, "valid_every": 4, "save_every": 4, "keep_checkpoints": 3},
    )
    Trainer(config, tmp / "run", log_to_stderr=False).run()
    return tmp / "run"


def _ids(directory, stem):  # type: ignore[no-untyped-def]
    return np.load(directory / f"{stem}.npy")


def test_prepare_trains_one_vocabulary_a_language_and_encodes_each_side_with_its_own(tmp_path):
    config = tiny_run_config(tmp_path, data={"joint_vocab": False}).data
    out = tmp_path / "prepared"
    summary = prepare(config, out, log=lambda _: None)
    assert not (out / "spm.model").exists()
    source, target = Vocabulary(out / "spm.src.model"), Vocabulary(out / "spm.tgt.model")
    pieces = {
        name: {vocab.sp.id_to_piece(i) for i in range(4, len(vocab))}
        for name, vocab in (("source", source), ("target", target))
    }
    # each language's own alphabet: no upper case in the source's, no lower in the target's
    assert not any(c.isupper() for p in pieces["source"] for c in p)
    assert not any(c.islower() for p in pieces["target"] for c in p)
    assert summary["src_vocab_size"] == len(source) and summary["vocab_size"] == len(target)
    for split in ("train", "valid", "test"):  # each side in its own vocabulary's ids
        first = (out / f"{split}.xx").read_text().splitlines()[0] if split != "train" else None
        src, tgt = _ids(out, f"{split}.src"), _ids(out, f"{split}.tgt")
        assert src.max() < len(source) and tgt.max() < len(target)
        if first is not None:
            assert src[: len(source.encode([first])[0])].tolist() == source.encode([first])[0]
    logged: list[str] = []
    prepare(config, out, log=logged.append)  # unchanged: nothing to do
    assert any("up to date" in line for line in logged)
    # back to one shared vocabulary: rebuilt, the two of the separate build gone
    joint = tiny_run_config(tmp_path).data
    joint_summary = prepare(joint, out, log=lambda _: None)
    assert (out / "spm.model").is_file() and "src_vocab_size" not in joint_summary
    assert not (out / "spm.src.model").exists() and not (out / "spm.tgt.model").exists()


def test_the_source_embedding_is_its_own_and_the_target_one_tied_to_the_output():
    config = load_config("weighted-tiny").model
    torch.manual_seed(0)
    model = build_model(config, vocab_size=50, source_vocab_size=70)
    assert model.source_vocab_size == 70 and model.embedding.weight.shape[0] == 50
    assert {"source_embedding.weight", "embedding.weight"} <= set(model.state_dict())
    src = torch.randint(4, 70, (2, 5))
    tgt = torch.randint(4, 50, (2, 4))
    model(src, tgt).logits.sum().backward()
    # the encoder reads the source's table only at the source's ids; the output is x·Eᵀ of
    # the target's, whose every row then has a gradient
    touched = model.source_embedding.weight.grad.abs().sum(1) > 0
    assert set(touched.nonzero().flatten().tolist()) == set(src.flatten().tolist())
    assert bool((model.embedding.weight.grad.abs().sum(1) > 0)[4:].all())
    # a shared vocabulary builds the model as it always has: the same draws, no second table
    torch.manual_seed(0)
    shared = build_model(config, vocab_size=50)
    torch.manual_seed(0)
    again = build_model(config, vocab_size=50, source_vocab_size=None)
    assert shared.source_vocab_size is None and "source_embedding.weight" not in shared.state_dict()
    assert all(
        torch.equal(a, b) for a, b in zip(shared.parameters(), again.parameters(), strict=True)
    )


def test_a_run_keeps_both_vocabularies_and_decodes_with_each_on_its_side(run):
    for name in ("spm.src.model", "spm.tgt.model"):
        assert (run / name).is_file() and (run / f"{name}.sha256").is_file()
    assert not (run / "spm.model").exists()
    translator = Translator.load(run)
    assert not translator.vocab.joint and translator.model.source_vocab_size == len(
        translator.vocab.source
    )
    ids = translator.encode(SOURCES)
    assert ids == translator.vocab.source.encode(SOURCES)
    for nbest in translator.translate_ids(ids, beam=3, nbest=2):
        for hyp in nbest:
            assert hyp.text == translator.vocab.target.decode(list(hyp.ids))
    assert translator.pieces(ids[0], source=True) == [
        translator.vocab.source.sp.id_to_piece(i) for i in ids[0]
    ]


def test_a_damaged_or_missing_vocabulary_of_a_run_is_refused_naming_it(run, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoints", ".lock"))
    with open(copy / "spm.tgt.model", "ab") as f:
        f.write(b"\0")
    with pytest.raises(CheckpointError, match=r"spm\.tgt\.model: the vocabulary is damaged"):
        Translator.load(copy)
    (copy / "spm.tgt.model").unlink()
    with pytest.raises(CheckpointError, match=r"no spm\.tgt\.model there"):
        Translator.load(copy)


def test_resume_checks_both_vocabularies(run, tmp_path):
    import shutil

    from wtnmt.config import load_config as load
    from wtnmt.errors import TrainingError

    copy, data = tmp_path / "copy", tmp_path / "data"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns(".lock"))
    config = load(copy / "config.yaml")
    shutil.copytree(config.data.prepared_path(), data)
    Trainer(config, copy, resume=True, log_to_stderr=False, data_dir=data).rundir.unlock()
    # the source's vocabulary replaced by another (the target's, the same size): refused
    (data / "spm.src.model").write_bytes((data / "spm.tgt.model").read_bytes())
    with pytest.raises(TrainingError, match="not the one"):
        Trainer(config, copy, resume=True, log_to_stderr=False, data_dir=data)


def test_average_prune_and_serve_carry_both_vocabularies(run, tmp_path):
    from fastapi.testclient import TestClient

    from wtnmt.serve.app import create_app
    from wtnmt.serve.settings import ServeSettings

    averaged, pruned = tmp_path / "averaged", tmp_path / "pruned"
    assert cli(["average", str(run), "--last", "2", "--out", str(averaged)]) == 0
    assert cli(["prune", str(run), "--keep", "2", "--out", str(pruned)]) == 0
    want = Translator.load(run).translate(SOURCES)
    for made in (averaged, pruned):
        assert (made / "spm.src.model").is_file() and (made / "spm.tgt.model").is_file()
        translator = Translator.load(made)
        assert not translator.vocab.joint
        translator.translate(SOURCES)  # decodes with its vocabularies
    translator = Translator.load(run)
    with TestClient(create_app(translator, ServeSettings())) as client:
        info = client.get("/v1/model").json()
        assert info["joint_vocabulary"] is False
        assert info["source_vocabulary_size"] == len(translator.vocab.source)
        assert info["vocabulary_size"] == len(translator.vocab.target)
        answer = client.post("/v1/translate", json={"text": SOURCES, "attention": True}).json()
        assert answer["translations"] == want
        ids = translator.encode(SOURCES)
        for maps, src, nbest in zip(
            answer["attention"], ids, translator.translate_ids(ids), strict=True
        ):
            if maps is not None:  # the maps labelled by each side's own pieces
                assert maps["source"] == [*translator.pieces(src, source=True), "</s>"]
                assert maps["target"] == [*translator.pieces(nbest[0].ids), "</s>"]


def test_prepare_on_the_command_line_takes_joint_vocab_false(tmp_path, capsys):
    config = tiny_run_config(tmp_path).data
    out = tmp_path / "cli-prepared"
    code = cli(
        prepare_args(
            config.train_src,
            config.train_tgt,
            out,
            *("--valid-src", config.valid_src, "--valid-tgt", config.valid_tgt),
            *("--test-src", config.test_src, "--test-tgt", config.test_tgt),
            *("--set", "data.joint_vocab=false"),
        )
    )
    assert code == 0
    assert (out / "spm.src.model").is_file() and (out / "spm.tgt.model").is_file()
    assert "source and" in capsys.readouterr().out
    assert json.loads((out / "manifest.json").read_text())["options"]["joint_vocab"] is False


def test_a_directory_prepared_before_joint_vocab_existed_stays_current(tmp_path):
    """The key's default builds what was built before it: it is left out of the fingerprint
    (and the manifest's options), so directories prepared before it are not rebuilt."""
    import hashlib

    from wtnmt.data.corpora import sha256_of
    from wtnmt.data.prepare import FORMAT_VERSION, fingerprint

    config = tiny_run_config(tmp_path).data
    files = [config.train_src, config.train_tgt, config.valid_src, config.valid_tgt]
    files += [config.test_src, config.test_tgt]
    key, manifest = fingerprint(config, [Path(f) for f in files])
    assert "joint_vocab" not in manifest["options"]
    before = json.dumps(  # the key as prepare computed it before data.joint_vocab
        {
            "version": FORMAT_VERSION,
            "options": manifest["options"],
            "inputs": [(i["name"], sha256_of(i["path"])) for i in manifest["inputs"]],
        },
        sort_keys=True,
    )
    assert key == hashlib.sha256(before.encode()).hexdigest()
    separate = tiny_run_config(tmp_path, data={"joint_vocab": False}).data
    assert fingerprint(separate, [Path(f) for f in files])[0] != key


def test_vocabularies_swapped_with_their_checksums_are_refused_as_not_the_weights(
    run, tmp_path, capsys
):
    """Each vocabulary matches its own .sha256, yet they are not the ones the weights were
    trained with: the hash in model.safetensors' header (and in an average's) says so."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns(".lock"))
    Translator.load(copy)  # the run as trained loads
    assert cli(["average", str(copy), "--last", "2", "--out", str(tmp_path / "avg")]) == 0
    for run_dir in (copy, tmp_path / "avg"):
        for suffix in ("", ".sha256"):
            src, tgt = run_dir / f"spm.src.model{suffix}", run_dir / f"spm.tgt.model{suffix}"
            a, b = src.read_bytes(), tgt.read_bytes()
            src.write_bytes(b), tgt.write_bytes(a)
        with pytest.raises(CheckpointError, match=r"not the vocabularies model\.safetensors was"):
            Translator.load(run_dir)
        capsys.readouterr()
        assert cli(["translate", str(run_dir), "-i", "-"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "were they swapped or replaced?" in err
