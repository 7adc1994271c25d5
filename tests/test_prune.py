"""`wtnmt prune`: a pruned Weighted Transformer computes the full one with the removed branches
masked (their α = 0), a branch of κ = α = 0 goes without changing an output, the criteria and
budgets choose as written, and the result is a run every command reads; mistakes are refused
in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from helpers import tiny_run_config, train_tiny
from wtnmt.cli import main
from wtnmt.config import ConfigError, config_from_dict, config_to_dict, load_config
from wtnmt.decode.search import beam_search, greedy_search
from wtnmt.decode.translator import Translator
from wtnmt.model import build_model, count_parameters
from wtnmt.model.pruning import branched_sublayers, branches_masked, prune_state, pruned_config
from wtnmt.prune.criteria import importance_scores, kappa_alpha_scores, random_scores, select
from wtnmt.rundir import read_weights
from wtnmt.train import Trainer

VOCAB = 40
VARIANTS = {
    "post-split": {},
    "pre-shared": {"norm": "pre", "branch_ffn": "shared"},
    "weighted-self-transparent": {
        "decoder_self_attention": "weighted",
        "encoder_combination": "transparent",
        "encoder_layers": 3,
    },
    "fixed": {"branch_weights": "fixed"},
}


def random_model(variant: dict, seed: int = 0):  # type: ignore[no-untyped-def]
    """A weighted-tiny model with every weight drawn, κ and α random points of the simplex,
    non-zero biases: nothing that would hide a misplaced block."""
    values = config_to_dict(load_config("weighted-tiny"))["model"]
    values.update(dropout=0.0, attention_dropout=0.0, **variant)
    config = config_from_dict({"model": values}).model
    torch.manual_seed(seed)
    model = build_model(config, vocab_size=VOCAB).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("b1", "b2")):
                p.normal_()
            elif name.endswith(("kappa", "alpha")) and config.branch_weights != "fixed":
                p.copy_(torch.rand_like(p) + 0.1).div_(p.sum())
    return config, model


def kept_sets(model, seed: int) -> dict:  # type: ignore[no-untyped-def]
    """A random non-empty subset of branches in every branched sublayer."""
    g = torch.Generator().manual_seed(seed)
    kept = {}
    for key, (_, module) in branched_sublayers(model).items():
        m = module.w_out.size(0)
        n = int(torch.randint(1, m + 1, (1,), generator=g))
        kept[key] = sorted(torch.randperm(m, generator=g)[:n].tolist())
    return kept


def pruned(config, model, kept):  # type: ignore[no-untyped-def]
    small = build_model(pruned_config(config, kept), vocab_size=VOCAB).double().eval()
    small.load_state_dict(prune_state(model, kept))
    return small


def batch(seed: int = 3):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (3, 7), generator=g)
    src[1, 5:] = 0  # padding
    return src, torch.randint(4, VOCAB, (3, 6), generator=g)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("seed", [1, 2])
def test_pruned_model_equals_the_full_model_with_those_branches_masked(variant, seed):
    config, model = random_model(VARIANTS[variant], seed)
    kept = kept_sets(model, seed)
    masked = {k: [i for i in range(config.heads) if i not in v] for k, v in kept.items()}
    assert any(masked.values())
    small = pruned(config, model, kept)
    src, tgt = batch(seed)
    with torch.no_grad():
        full = model(src, tgt).logits
        with branches_masked(model, masked):
            reference = model(src, tgt).logits
            greedy_ref = greedy_search(model, src, max_len_b=6)
            beam_ref = beam_search(model, src, beam=3, max_len_b=6)
        out = small(src, tgt).logits
        torch.testing.assert_close(out, reference, rtol=1e-10, atol=1e-10)
        assert not torch.allclose(out, full)  # the removed branches did something
        # step-wise decoding reads the pruned layers' caches alike
        assert [h.tokens for h in greedy_search(small, src, max_len_b=6)] == [
            h.tokens for h in greedy_ref
        ]
        beams = [n[0] for n in beam_search(small, src, beam=3, max_len_b=6)]
        assert [h.tokens for h in beams] == [n[0].tokens for n in beam_ref]
        for a, b in zip(beams, beam_ref, strict=True):
            assert a.score == pytest.approx(b[0].score, abs=1e-9)
    # the masks were lifted: the full model is whole again
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt).logits, full, rtol=0, atol=0)
    assert count_parameters(small) < count_parameters(model)


@pytest.mark.parametrize("variant", ["post-split", "pre-shared"])
def test_a_branch_whose_kappa_and_alpha_are_zero_goes_without_changing_any_output(variant):
    config, model = random_model(VARIANTS[variant], seed=5)
    doomed = {key: [1, 3] if key[1] % 2 else [0] for key in branched_sublayers(model)}
    with torch.no_grad():
        for key, (_, module) in branched_sublayers(model).items():
            w = module.branch_weights
            w.kappa[doomed[key]] = 0.0
            w.alpha[doomed[key]] = 0.0
            w.kappa.div_(w.kappa.sum())
            w.alpha.div_(w.alpha.sum())
    kept = {k: [i for i in range(config.heads) if i not in v] for k, v in doomed.items()}
    small = pruned(config, model, kept)
    src, tgt = batch()
    with torch.no_grad():
        torch.testing.assert_close(small(src, tgt).logits, model(src, tgt).logits)
        a, b = greedy_search(small, src, max_len_b=6), greedy_search(model, src, max_len_b=6)
    assert [h.tokens for h in a] == [h.tokens for h in b]
    # and both criteria that measure say so: κ·α = 0, masking it changes the dev loss by 0
    weights = kappa_alpha_scores(model)
    loss = lambda: float(model(src, tgt).logits.logsumexp(-1).mean())  # noqa: E731
    with torch.no_grad():
        _, importance = importance_scores(model, loss)
    for key, indices in doomed.items():
        assert all(weights[key][i] == 0.0 for i in indices)
        assert all(importance[key][i] == 0.0 for i in indices)
        assert any(importance[key][i] != 0.0 for i in kept[key])


def test_pruning_again_names_the_original_branches():
    config, model = random_model({}, seed=2)
    first = {k: [0, 2, 3] for k in branched_sublayers(model)}
    small = pruned(config, model, first)
    again = {k: [1] for k in first}  # the second of (0, 2, 3): branch 2
    smaller_config = pruned_config(pruned_config(config, first), again)
    assert smaller_config.kept_branches.encoder == ((2,), (2,))
    tiny = build_model(smaller_config, vocab_size=VOCAB).double().eval()
    tiny.load_state_dict(prune_state(small, again))
    direct = pruned(config, model, {k: [2] for k in first})
    src, tgt = batch()
    with torch.no_grad():
        torch.testing.assert_close(tiny(src, tgt).logits, direct(src, tgt).logits)


def test_budgets_keep_the_best_per_layer_or_over_the_model():
    scores = {
        ("encoder", 0): [0.1, 0.5, 0.3, 0.2],
        ("encoder", 1): [0.9, 0.8, 0.0, 0.7],
        ("decoder", 0): [0.05, 0.01, 0.02, 0.0],
    }
    assert select(scores, keep=2) == {
        ("encoder", 0): [1, 2],
        ("encoder", 1): [0, 1],
        ("decoder", 0): [0, 2],
    }
    # global 5: each layer's best (0.5, 0.9, 0.05), then the two best of the rest (0.8, 0.7)
    assert select(scores, keep_total=5) == {
        ("encoder", 0): [1],
        ("encoder", 1): [0, 1, 3],
        ("decoder", 0): [0],
    }
    assert select(scores, keep_total=3) == select(scores, keep=1)
    assert select({("encoder", 0): [0.2, 0.2, 0.1]}, keep=1) == {("encoder", 0): [0]}  # ties


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        ({"keep": 0}, "--keep 0: a layer keeps at least one branch"),
        ({"keep": 5}, "--keep 5: the model has at most 4 branches a layer"),
        ({"keep_total": 2}, "--keep-total 2: below one branch a layer (the model has 3"),
        ({"keep_total": 13}, "--keep-total 13: the model has 12 branches"),
    ],
)
def test_budgets_out_of_range_are_refused(budget, message):
    scores = {("encoder", i): [0.1, 0.2, 0.3, 0.4] for i in range(3)}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        select(scores, **budget)


def test_random_scores_follow_the_seed():
    _, model = random_model({})
    assert random_scores(model, 1) == random_scores(model, 1) != random_scores(model, 2)


# ------------------------------------------------------------------------- the command
@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("prune")
    return train_tiny(tmp, max_steps=12, valid_every=4, keep_checkpoints=3)


def test_a_pruned_run_is_a_run_every_command_reads(run, tmp_path, capsys):
    out = tmp_path / "p"
    argv = ["prune", str(run), "--out", str(out), "--keep", "2", "--criterion", "kappa-alpha"]
    assert main(argv) == 0
    assert "8 of 16 branches kept (kappa-alpha)" in capsys.readouterr().out
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["prune"]["criterion"] == "kappa-alpha" and config["prune"]["keep"] == 2
    assert all(len(k) == 2 for k in config["model"]["kept_branches"]["encoder"])
    record = json.loads((out / "prune.json").read_text())
    # κ·α of the kept are the largest of each layer
    for side in ("encoder", "decoder"):
        for scores, removed in zip(record["scores"][side], record["removed"][side], strict=True):
            kept = [s for i, s in enumerate(scores) if i not in removed]
            assert min(kept) >= max(scores[i] for i in removed)
    assert record["parameters"]["after"] < record["parameters"]["before"]
    # the weights are the source's blocks
    full, small = read_weights(run / "model.safetensors"), read_weights(out / "model.safetensors")
    kept0 = config["model"]["kept_branches"]["encoder"][0]
    name = "encoder_layers.0.self_attn.w_out"
    assert torch.equal(small[name], full[name][kept0])
    # translate and evaluate read it
    src = run.parent / "test.src"
    assert main(["translate", str(out), "--input", str(src), "--output", str(tmp_path / "h")]) == 0
    assert len((tmp_path / "h").read_text().splitlines()) == 8
    ref = run.parent / "test.tgt"
    assert main(["evaluate", str(out), "--src", str(src), "--ref", str(ref)]) == 0
    assert Translator.load(out).model is not None


def test_importance_prunes_by_the_measured_dev_loss(run, tmp_path):
    out = tmp_path / "p"
    assert main(["prune", str(run), "--out", str(out), "--keep-total", "5"]) == 0
    record = json.loads((out / "prune.json").read_text())
    assert record["criterion"] == "importance" and record["branches"]["after"] == 5
    assert record["dev_nll_full"] > 0
    # the oracle: masking branch (decoder 1, i) by hand changes the dev loss by its score
    from wtnmt.prune.run import dev_loss_of
    from wtnmt.rundir import load_run

    config, _, model = load_run(run)
    model.eval()
    loss = dev_loss_of(config, run, model, log=lambda m: None)
    base = loss()
    assert base == pytest.approx(record["dev_nll_full"], abs=1e-6)
    for i in range(4):
        with branches_masked(model, {("decoder", 1): [i]}):
            rise = loss() - base
        assert rise == pytest.approx(record["scores"]["decoder"][1][i], abs=1e-5)


def test_fine_tune_trains_the_rest_with_kappa_alpha_kept(run, tmp_path):
    out = tmp_path / "ft"
    argv = ["prune", str(run), "--out", str(out), "--keep", "1", "--criterion", "random"]
    assert main([*argv, "--fine-tune", "4", "--set", "train.valid_every=2"]) == 0
    config = load_config(out / "config.yaml")
    assert config.prune.fine_tune_steps == 4 and config.train.max_steps == 4
    assert config.train.freeze_branch_weights == 4 and config.train.lr_schedule == "linear"
    assert config.train.threads is None  # the process's (--threads), not the source's
    before = json.loads((out / "prune.json").read_text())
    assert before["fine_tune_steps"] == 4
    tuned = read_weights(out / "model.safetensors")
    # κ, α as pruned (not renormalised, not learned); the rest moved
    full = read_weights(run / "model.safetensors")
    kept = config.model.kept_branches.decoder[0]
    name = "decoder_layers.0.cross_attn.branch_weights.alpha"
    assert torch.equal(tuned[name], full[name][list(kept)])
    assert not torch.equal(tuned["embedding.weight"], full["embedding.weight"])
    assert main(["average", str(out), "--last", "2", "--out", str(tmp_path / "avg")]) == 0
    assert Translator.load(tmp_path / "avg").translate(["alpha beta"])


def test_refusals_are_one_line_and_write_nothing(run, tmp_path, capsys):
    multi = tmp_path / "multi"
    (tmp_path / "m").mkdir()
    Trainer(
        tiny_run_config(tmp_path / "m", model={"attention": "multihead"}, train={"max_steps": 2}),
        multi,
        log_to_stderr=False,
    ).run()
    holds = tmp_path / "holds"
    holds.mkdir()
    (holds / "model.safetensors").write_bytes(b"mine")
    cases = [
        ([str(run), "--keep-total", "3"], "below one branch a layer (the model has 4"),
        ([str(multi), "--keep", "1"], "a Transformer (model.attention: multihead) has no branches"),
        ([str(run), "--keep", "1", "--set", "train.max_steps=3"], "give --fine-tune STEPS too"),
        (
            [str(run), "--keep", "1", "--fine-tune", "2", "--set", "model.dropout=0.2"],
            "the fine-tune takes train.* settings only",
        ),
    ]
    for args, message in cases:
        out = tmp_path / "out"
        assert main(["prune", *args, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
        assert not out.exists()
    with pytest.raises(SystemExit) as exit_:  # argparse's own check
        main(["prune", str(run), "--keep", "0", "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --keep: 0: must be at least 1" in err and err.count("\n") == 1
    assert main(["prune", str(run), "--keep", "1", "--out", str(holds)]) == 2
    err = capsys.readouterr().err
    assert "holds a model (model.safetensors)" in err and err.count("\n") == 1
    assert (holds / "model.safetensors").read_bytes() == b"mine"  # untouched
    assert main(["prune", str(run), "--keep", "1", "--out", str(run)]) == 2
    assert "is the run being pruned" in capsys.readouterr().err


def test_an_interrupted_fine_tune_keeps_its_record_and_says_how_to_finish(
    run, tmp_path, capsys, monkeypatch
):
    from wtnmt.train.loop import TrainingLoop

    out = tmp_path / "ft"
    argv = ["prune", str(run), "--out", str(out), "--keep", "1", "--criterion", "random"]
    step = TrainingLoop._step

    def interrupted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.state.step == 2:  # Ctrl-C after two updates
            raise KeyboardInterrupt
        return step(self, *args, **kwargs)

    monkeypatch.setattr(TrainingLoop, "_step", interrupted)
    assert main([*argv, "--fine-tune", "4"]) == 130
    monkeypatch.undo()
    record = json.loads((out / "prune.json").read_text())
    assert record["fine_tuned"] is False and record["removed"] and record["scores"]
    assert not (out / "finished.json").exists()
    capsys.readouterr()
    assert main([*argv, "--fine-tune", "4"]) == 2
    err = capsys.readouterr().err
    resume = f"wtnmt train {out / 'config.yaml'} --out {out} --resume"
    assert err.count("\n") == 1 and "interrupted" in err and resume in err
    assert main(resume.split()[1:]) == 0
    assert "the fine-tune of its prune finished" in capsys.readouterr().out
    finished = json.loads((out / "prune.json").read_text())
    assert finished == {**record, "fine_tuned": True}
    assert load_config(out / "config.yaml").prune.fine_tune_steps == 4


def test_a_fine_tune_killed_before_its_first_update_resumes_and_a_fresh_train_is_refused(
    run, tmp_path, capsys, monkeypatch
):
    """A fine-tune killed at once (SIGKILL, the OOM killer: no handler saves anything): the
    pruned weights are the checkpoint of update 0, so `--resume` finishes it as a fine-tune
    never stopped; a fresh `wtnmt train` into its folder (which trained the pruned shape from
    random weights under the prune's record) is refused in one line."""
    from wtnmt.train.loop import TrainingLoop

    argv = ["prune", str(run), "--keep", "1", "--criterion", "random", "--fine-tune", "4"]
    assert main([*argv, "--out", str(tmp_path / "straight")]) == 0
    out = tmp_path / "killed"

    def killed(self):  # type: ignore[no-untyped-def]
        raise SystemExit(137)  # the process ends here: nothing after it runs

    monkeypatch.setattr(TrainingLoop, "_train", killed)
    with pytest.raises(SystemExit):
        main([*argv, "--out", str(out)])
    monkeypatch.undo()
    assert json.loads((out / "prune.json").read_text())["fine_tuned"] is False
    capsys.readouterr()
    assert main(["train", str(out / "config.yaml"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds a run: add --resume" in err
    saved = sorted((out / "checkpoints").iterdir())
    for path in saved:  # without its checkpoint, the prune's record still refuses it
        path.rename(tmp_path / path.name)
    assert main(["train", str(out / "config.yaml"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a `wtnmt prune` run (prune.json)" in err
    for path in saved:
        (tmp_path / path.name).rename(path)
    assert main(["train", str(out / "config.yaml"), "--out", str(out), "--resume"]) == 0
    assert json.loads((out / "prune.json").read_text())["fine_tuned"] is True
    a, b = (read_weights(d / "model.safetensors") for d in (tmp_path / "straight", out))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_fresh_run_is_refused_in_the_folder_of_a_run_with_other_settings(tmp_path, capsys):
    """A run that died before its first checkpoint left its files; a new run of another model
    there would append to its curve, under its name: refused, naming what differs."""
    config = tiny_run_config(tmp_path, train={"max_steps": 1})
    out = tmp_path / "run"
    trainer = Trainer(config, out, log_to_stderr=False)  # its files written, no update yet
    trainer.rundir.unlock()
    other = tmp_path / "other.yaml"
    values = config_to_dict(config)
    values["model"]["d_model"] = 64
    other.write_text(yaml.safe_dump(values))
    assert main(["train", str(other), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds the files of another run" in err
    assert "model.d_model 32 → 64" in err


def test_the_config_refuses_a_kept_branch_list_that_does_not_fit():
    values = config_to_dict(load_config("weighted-tiny"))
    values["model"]["kept_branches"] = {"encoder": [[0], [1]], "decoder": [[0, 4], [1]]}
    with pytest.raises(ConfigError, match=r"decoder\[0\]=\[0, 4\]: expected increasing"):
        config_from_dict(values)
    values["model"]["kept_branches"] = {"encoder": [[0]], "decoder": [[0], [1]]}
    with pytest.raises(ConfigError, match="lists 1 layers; the model has"):
        config_from_dict(values)
    values["model"]["kept_branches"] = {"encoder": [[], [1]], "decoder": [[0], [1]]}
    with pytest.raises(ConfigError, match="keeps at least one branch"):
        config_from_dict(values)


def test_a_pruned_run_serves_with_its_branches_and_their_attention(run, tmp_path):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient

    from wtnmt.serve.app import create_app
    from wtnmt.serve.settings import ServeSettings

    out = tmp_path / "p"
    assert main(["prune", str(run), "--out", str(out), "--keep-total", "6"]) == 0
    translator = Translator.load(out)
    with TestClient(create_app(translator, ServeSettings())) as client:
        info = client.get("/v1/model").json()
        widths = sorted(len(w["alpha"]) for w in info["branch_weights"])
        assert sum(widths) == 6 and widths[0] == 1  # each sublayer its own number of branches
        assert info["parameters"] == count_parameters(translator.model)
        body = {"text": ["alpha beta gamma"], "attention": True}
        got = client.post("/v1/translate", json=body).json()
    assert got["translations"] == translator.translate(["alpha beta gamma"])
    # branches keep the numbers they had in the trained model, in the weights and the maps
    kept = translator.config.model.kept_branches
    numbered = {
        f"{attr}.{i}.{child}": [b + 1 for b in branches]
        for attr, child, layers in (
            ("encoder_layers", "self_attn", kept.encoder),
            ("decoder_layers", "cross_attn", kept.decoder),
        )
        for i, branches in enumerate(layers)
    }
    assert {w["layer"]: w["branches"] for w in info["branch_weights"]} == numbered
    assert any(numbers != list(range(1, len(numbers) + 1)) for numbers in numbered.values())
    layers = got["attention"][0]["layers"]
    assert [layer["branches"] for layer in layers] == [[b + 1 for b in k] for k in kept.decoder]
    assert [len(layer["maps"]) for layer in layers] == [len(k) for k in kept.decoder]


def test_prune_keeps_freed_memory_as_train_does(run, tmp_path, monkeypatch):
    # without the allocator setting `wtnmt train` makes, a fine-tune's steps were 1.5× slower
    import wtnmt.runtime

    calls = []
    monkeypatch.setattr(wtnmt.runtime, "tune_cpu_allocator", lambda: calls.append(1) or True)
    assert main(["prune", str(run), "--out", str(tmp_path / "p"), "--keep", "1"]) == 0
    assert calls
