#!/usr/bin/env python3
"""One Marian model of OPUS-MT's size, three engines: wtnmt's native engine on the run `wtnmt
import hf` makes of it, `transformers`' ``generate`` on the folder itself, and CTranslate2 on
what CTranslate2's own converter (``TransformersConverter``) makes of the same folder.

    python benchmarks/marian_engines.py [--sentences 160] [--rounds 2] [--threads 1 2] [--record]

The model: OPUS-MT en-de's configuration (``Helsinki-NLP/opus-mt-en-de``: D=512, 6+6 layers,
8 heads, F=2048, swish, attention biases, ``final_logits_bias``, 58,101 pieces shared by
encoder, decoder and output), random seeded weights, saved as a Marian folder with a
SentencePiece model and vocab.json made here (the pieces of ``../shared/bench``'s synthetic
corpus, then fillers up to 58,101). With random weights the work does not depend on them once
the output length is forced: every engine writes exactly 24 tokens a sentence (minimum and
maximum length 24), as ../shared/bench/PEERS.md measured the peers. The sentences: the first
``--sentences`` of make_synthetic.py's test set, sorted by length, batches of 32; greedy and
beam 5, float32 and int8 (wtnmt: ``quantize="int8"``; generate: PyTorch's dynamic int8
quantisation of every ``nn.Linear``, the output projection included; CTranslate2: its int8
conversion), on 1 and 2 threads. Model loading is excluded.

Each (threads, precision, search) setting times the three engines one after the other, their
order rotated from round to round; a figure is output tokens a second, the median of
``--rounds``. Before timing, the engines' greedy outputs for the first batch are compared
(with random weights near-ties can part them; the count is printed). CTranslate2 is imported
before torch and its translator loaded in a helper thread, as decode_vs_ctranslate2.py does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ctranslate2  # before torch (decode_vs_ctranslate2.py)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from records import add_record_argument
from wtnmt.export.ctranslate2 import _in_helper_thread  # (as ct2_bridge.py)

LENGTH = 24  # output tokens a sentence, forced
BATCH = 32
VOCAB = 58_101  # opus-mt-en-de's
SHARED = Path(__file__).resolve().parents[2] / "shared" / "bench"


def _spm(pieces: list[str], path: Path) -> None:
    """A unigram SentencePiece model of ``pieces`` (<unk> 0, <s> 1, </s> 2 as OPUS-MT's)."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    for i, (piece, kind) in enumerate(
        [("<unk>", 2), ("<s>", 3), ("</s>", 3)] + [(p, 1) for p in pieces]
    ):
        entry = proto.pieces.add()
        entry.piece, entry.type, entry.score = piece, kind, -float(i) if kind == 1 else 0.0
    proto.trainer_spec.model_type = pb.TrainerSpec.UNIGRAM
    proto.trainer_spec.vocab_size = len(proto.pieces)
    proto.trainer_spec.unk_id, proto.trainer_spec.bos_id, proto.trainer_spec.eos_id = 0, 1, 2
    proto.trainer_spec.pad_id = -1
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = True
    path.write_bytes(proto.SerializeToString())


def corpus(sentences: int) -> list[list[str]]:
    """The first ``sentences`` test sentences of make_synthetic.py, as pieces."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="marian-bench-data.") as out:
        subprocess.run([sys.executable, str(SHARED / "make_synthetic.py"), out], check=True,
                       capture_output=True)  # fmt: skip
        lines = (Path(out) / "test.src").read_text(encoding="utf-8").splitlines()[:sentences]
    return [line.split() for line in lines]


def marian_folder(folder: Path, words: list[str]) -> None:
    """OPUS-MT en-de's configuration with random seeded weights, and its tokenizer files."""
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    pieces = list(dict.fromkeys(words))
    pieces += [f"▁filler{i}" for i in range(VOCAB - 2 - len(pieces) - 1)]
    table = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)}}
    table["<pad>"] = len(table)
    assert len(table) == VOCAB
    folder.mkdir(parents=True)
    (folder / "vocab.json").write_text(json.dumps(table, ensure_ascii=False), encoding="utf-8")
    for name in ("source.spm", "target.spm"):
        _spm(pieces, folder / name)
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "en", "target_lang": "de", "tokenizer_class": "MarianTokenizer"})
    )
    pad = table["<pad>"]
    config = MarianConfig(
        vocab_size=VOCAB, decoder_vocab_size=VOCAB, d_model=512, encoder_layers=6,
        decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
        encoder_ffn_dim=2048, decoder_ffn_dim=2048, activation_function="swish",
        max_position_embeddings=512, scale_embedding=True, pad_token_id=pad, eos_token_id=0,
        decoder_start_token_id=pad, forced_eos_token_id=0, share_encoder_decoder_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(1)
    model = MarianMTModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.02)
        model.final_logits_bias.normal_(0, 0.1)
        model.model.shared.weight[pad] = 0.0  # as OPUS-MT's conversion from Marian has it
    model.save_pretrained(str(folder))
    generation = GenerationConfig(
        num_beams=4,
        max_length=512,
        bad_words_ids=[[pad]],
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
    )
    generation.save_pretrained(str(folder))


class Engines:
    """The three engines on one model, each asked for the same batches."""

    def __init__(self, folder: Path, run: Path, ct2_dir: Path, sentences: list[list[str]]):
        import torch
        from transformers import MarianMTModel

        from wtnmt import Translator

        table = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        self.pad = table["<pad>"]
        order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
        self.batches = [[sentences[i] for i in order[j : j + BATCH]]
                        for j in range(0, len(order), BATCH)]  # fmt: skip
        self.hf_ids = [[[table[p] for p in s] + [0] for s in b] for b in self.batches]
        self.hf = {"float32": MarianMTModel.from_pretrained(str(folder)).eval()}
        self.hf["int8"] = torch.ao.quantization.quantize_dynamic(
            MarianMTModel.from_pretrained(str(folder)).eval(), {torch.nn.Linear}, torch.qint8
        )
        self.wtnmt = {q: Translator.load(run, engine="native", quantize=q)
                      for q in ("none", "int8")}  # fmt: skip
        sp = self.wtnmt["none"].vocab.source.sp
        self.wt_ids = [[[sp.piece_to_id(p) for p in s] + [2] for s in b] for b in self.batches]
        self.ct2_dir = ct2_dir
        self.ct2: dict = {}

    def load_ct2(self, quantization: str, threads: int) -> None:
        self.ct2.clear()
        self.ct2["t"] = _in_helper_thread(lambda: ctranslate2.Translator(
            str(self.ct2_dir / quantization), device="cpu", inter_threads=1,
            intra_threads=threads))  # fmt: skip

    def generate(self, precision: str, beam: int, batches: int | None = None) -> list[list[int]]:
        import torch

        model, out = self.hf[precision], []
        for ids in self.hf_ids[:batches]:
            width = max(map(len, ids))
            x = torch.tensor([s + [self.pad] * (width - len(s)) for s in ids])
            with torch.inference_mode():
                found = model.generate(input_ids=x, attention_mask=x.ne(self.pad), num_beams=beam,
                                       min_new_tokens=LENGTH, max_new_tokens=LENGTH,
                                       early_stopping=True)  # fmt: skip
            out += [row[1:] for row in found.tolist()]
        return out

    def native(self, precision: str, beam: int, batches: int | None = None) -> list[list[int]]:
        import torch

        from wtnmt.decode.search import search_batch

        t, out = self.wtnmt["int8" if precision == "int8" else "none"], []
        for ids in self.wt_ids[:batches]:
            width = max(map(len, ids))
            x = torch.tensor([s + [0] * (width - len(s)) for s in ids])
            found = search_batch(t.network, x, beam=beam, min_len=LENGTH, max_len=LENGTH)
            out += [h[0].tokens for h in found]
        return out

    def ctranslate2(self, precision: str, beam: int, batches: int | None = None) -> list[list[str]]:
        t, out = self.ct2["t"], []
        for batch in self.batches[:batches]:
            results = t.translate_batch([[*s, "</s>"] for s in batch], beam_size=beam,
                                        min_decoding_length=LENGTH,
                                        max_decoding_length=LENGTH)  # fmt: skip
            out += [r.hypotheses[0] for r in results]
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    add_record_argument(parser)
    args = parser.parse_args()

    import warnings

    from transformers.utils import logging as hf_logging

    from wtnmt.runtime import machine_line

    hf_logging.set_verbosity_error()  # (generate's notes on max_length, once a batch)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*")
    print(machine_line(), flush=True)
    sentences = corpus(args.sentences)
    with tempfile.TemporaryDirectory(prefix="marian-bench.") as work:  # (~1 GB: removed after)
        return measure(args, sentences, Path(work))


def measure(args: argparse.Namespace, sentences: list[list[str]], work: Path) -> int:
    """Writes the model into ``work``, converts it, times the engines (main's settings)."""
    import torch
    from ctranslate2.converters import TransformersConverter

    from wtnmt.export.hf_import import import_hf
    from wtnmt.runtime import machine_line

    folder = work / "opus-mt-en-de-random"
    marian_folder(folder, [p for s in sentences for p in s])
    import_hf(folder, work / "run", say=lambda m: print(m, flush=True))
    for quantization in ("float32", "int8"):
        _in_helper_thread(lambda q=quantization: TransformersConverter(str(folder)).convert(
            str(work / "ct2" / q), quantization=q))  # fmt: skip
    engines = Engines(folder, work / "run", work / "ct2", sentences)
    tokens = sum(len(b) for b in engines.batches) * LENGTH

    torch.set_num_threads(max(args.threads))
    engines.load_ct2("float32", max(args.threads))
    vocab = {i: p for p, i in json.loads((folder / "vocab.json").read_text()).items()}
    hf = [[vocab[t] for t in row if t != engines.pad] for row in engines.generate("float32", 1)]
    wt = [engines.wtnmt["none"].pieces(row) for row in engines.native("float32", 1)]
    ct = engines.ctranslate2("float32", 1)
    n = len(hf)
    same_hf = sum(a in (b, b[:-1]) for a, b in zip(wt, hf, strict=True))
    same_ct = sum(a == b for a, b in zip(wt, ct, strict=True))
    print(f"greedy, float32: native = generate on {same_hf}/{n} sentences, native = "
          f"CTranslate2 on {same_ct}/{n}", flush=True)  # fmt: skip

    headers = ["threads", "precision", "search", "native tok/s", "generate tok/s",
               "CT2 tok/s", "native/generate", "native/CT2"]  # fmt: skip
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        for precision in ("float32", "int8"):
            engines.load_ct2(precision, threads)
            for beam in (1, 5):
                times: dict[str, list[float]] = {"native": [], "generate": [], "ctranslate2": []}
                names = list(times)
                for name in names:  # warm-up: packed weights, caches, threads
                    getattr(engines, name)(precision, beam, batches=1)
                for r in range(args.rounds):
                    for name in names[r % 3 :] + names[: r % 3]:
                        time.sleep(0.5)
                        start = time.perf_counter()
                        getattr(engines, name)(precision, beam)
                        times[name].append(time.perf_counter() - start)
                rate = {k: tokens / statistics.median(v) for k, v in times.items()}
                row = [str(threads), precision, "greedy" if beam == 1 else "beam 5",
                       f"{rate['native']:,.0f}", f"{rate['generate']:,.0f}",
                       f"{rate['ctranslate2']:,.0f}",
                       f"{rate['native'] / rate['generate']:.2f}",
                       f"{rate['native'] / rate['ctranslate2']:.2f}"]  # fmt: skip
                rows.append(row)
                print(" | ".join(row), flush=True)
    if args.record:
        from records import keep

        keep("marian-engines", machine=machine_line(), headers=headers, rows=rows,
             note=f"{args.sentences} sentences, {LENGTH} tokens each")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
