"""Can ONNX Runtime run wtnmt's whole search natively? A probe for the native-search engine.

    python benchmarks/ort_search_probe.py RUN [--beams 1,4,5] [--sentences 200] [--threads 2]

Exports RUN's model as the pair of subgraphs ONNX Runtime's ``BeamSearch`` contrib operator
takes (T5's interface: an encoder giving each decoder layer's cross-attention keys and values,
and a decoder step over past self-attention keys and values), built from the model's own
layers, and makes the search agree with wtnmt's (decode/search.py):

- PAD and BOS never chosen: the operator's ``vocab_mask`` (applied after its log-softmax, as
  wtnmt masks log-probabilities without renormalising them);
- EOS forced at each sentence's own limit a·|src| + b (``decode.max_len_a``, ``max_len_b``):
  inside the decoder graph, from the source mask, since the operator's ``max_length`` is one
  for the whole batch;
- a sentence done once it has ``beam`` finished hypotheses (``early_stopping``: fairseq's
  rule), ranked by log-probability / length^α (fairseq's length penalty; the GNMT form has no
  counterpart there);
- the source mask passed as ``attention_mask`` (derived from padding, the operator's own mask
  lets the decoder attend to padded positions).

Then it decodes the run's test sources with both engines, says where the tokens differ and
the largest score difference, and times each (one process, the same sentences and threads;
stop any training on the machine first).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from wtnmt import Translator
from wtnmt.analysis.scoring import split_pairs
from wtnmt.model.speed import plain_math
from wtnmt.special import BOS, EOS, PAD


class PastCache:
    """A decoder layer's cache in T5's layout: past keys and values [N, H, T, Dk] in, the
    present ones (past and this step's) out; cross keys and values [N, H, S, Dk]."""

    def __init__(self, cross_k: Tensor, cross_v: Tensor, bias: Tensor, k: Tensor, v: Tensor):
        self.cross_k, self.cross_v, self.bias, self.k, self.v = cross_k, cross_v, bias, k, v

    def attend_cross(self, q: Tensor, *, dropout_p: float = 0.0) -> Tensor:
        dk = q.size(-1)
        scores = torch.matmul(q.transpose(0, 1), self.cross_k.transpose(-1, -2)) * dk**-0.5
        return torch.matmul((scores + self.bias).softmax(-1), self.cross_v).transpose(0, 1)

    def attend_self(self, q: Tensor, k: Tensor, v: Tensor, *, dropout_p: float = 0.0) -> Tensor:
        dk = q.size(-1)
        self.k = torch.cat([self.k, k.transpose(0, 1)], dim=2)  # present [N, H, T+1, Dk]
        self.v = torch.cat([self.v, v.transpose(0, 1)], dim=2)
        scores = torch.matmul(q.transpose(0, 1), self.k.transpose(-1, -2)) * dk**-0.5
        return torch.matmul(scores.softmax(-1), self.v).transpose(0, 1)


class Encoder(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, ...]:
        src = ids.long().masked_fill(mask == 0, self.model.pad_id)
        enc = self.model.encode(src, always_mask=True)
        out = []
        for layer, memory in zip(self.model.decoder_layers, enc.memories, strict=True):
            k, v = layer.cross_attn.keys_values(memory)  # [H, B, S, Dk]
            out += [k.transpose(0, 1), v.transpose(0, 1)]
        return tuple(out)


class DecoderStep(nn.Module):
    def __init__(self, model: nn.Module, max_len_a: float, max_len_b: int) -> None:
        super().__init__()
        self.model, self.a, self.b = model, max_len_a, max_len_b

    def forward(self, ids: Tensor, mask: Tensor, *past: Tensor) -> tuple[Tensor, ...]:
        m, layers = self.model, len(self.model.decoder_layers)
        step = past[0].shape[2]  # tokens so far, BOS included: this step's position
        x = m.embedding(ids.long()) + m.positions.at(torch.arange(1) + step)
        bias = torch.zeros(mask.shape).masked_fill(mask == 0, -torch.inf)[:, None, None, :]
        selfs, crosses = past[: 2 * layers], past[2 * layers :]
        caches = [
            PastCache(crosses[2 * i], crosses[2 * i + 1], bias, selfs[2 * i], selfs[2 * i + 1])
            for i in range(layers)
        ]
        for layer, cache in zip(m.decoder_layers, caches, strict=True):
            x, _, _ = layer(x, None, src_pad=None, cache=cache)
        if m.decoder_norm is not None:
            x = m.decoder_norm(x)
        lprobs = F.log_softmax(m.embedding.logits(x), dim=-1)  # [N, 1, V]
        limit = (self.a * mask.sum(-1).float() + self.b).long().clamp(1, m.max_positions - 1)
        forced = (limit <= step)[:, None, None]  # at its limit a sentence may only end
        only_eos = torch.full_like(lprobs, -1e9).index_fill(-1, torch.tensor([EOS]), 0.0)
        return (torch.where(forced, only_eos, lprobs), *[t for c in caches for t in (c.k, c.v)])


def export(translator: Translator, directory: Path) -> Path:
    """The search model (BeamSearch over the two subgraphs) in ``directory``."""
    import onnx
    from onnx import TensorProto, helper
    from torch.export import Dim

    model, d = translator.model.eval(), translator.config.decode
    layers = len(model.decoder_layers)
    attention = model.decoder_layers[0].self_attn.attn
    h, dk = attention.heads, attention.proj.weight.size(0) // (3 * attention.heads)
    b, s = 2, 7
    ids, mask = torch.full((b, s), 5, dtype=torch.int32), torch.ones(b, s, dtype=torch.int32)
    mask[1, 5:] = 0
    batch, src, steps = Dim("batch"), Dim("src", max=model.max_positions - 1), Dim("steps")
    kinds = [f"{kv}_{{}}_{i}" for i in range(layers) for kv in ("key", "value")]
    encoder, step = Encoder(model).eval(), DecoderStep(model, d.max_len_a, d.max_len_b).eval()
    with torch.no_grad(), plain_math():
        torch.onnx.export(
            encoder, (ids, mask), str(directory / "encoder.onnx"),
            input_names=["encoder_input_ids", "encoder_attention_mask"],
            output_names=[f"present_{k.format('cross')}" for k in kinds],
            dynamic_shapes=({0: batch, 1: src}, {0: batch, 1: src}), opset_version=17,
            external_data=False,
        )  # fmt: skip
        cross = encoder(ids, mask)
        past = [torch.zeros(b, h, 3, dk) for _ in range(2 * layers)]
        past_names = [f"past_{k.format(kind)}" for kind in ("self", "cross") for k in kinds]
        past_shapes = tuple([{0: batch, 2: steps}] * len(past) + [{0: batch, 2: src}] * len(past))
        torch.onnx.export(
            step, (torch.full((b, 1), 5, dtype=torch.int32), mask, *past, *cross),
            str(directory / "decoder.onnx"),
            input_names=["input_ids", "encoder_attention_mask", *past_names],
            output_names=["logits"] + [f"present_{k.format('self')}" for k in kinds],
            dynamic_shapes=({0: batch}, {0: batch, 1: src}, past_shapes),
            opset_version=17, external_data=False,
        )  # fmt: skip
    enc, dec = (onnx.load(str(directory / f"{n}.onnx")) for n in ("encoder", "decoder"))
    enc.graph.name, dec.graph.name = "encoder", "decoder"
    names = ["input_ids", "max_length", "min_length", "num_beams", "num_return_sequences"]
    names += ["length_penalty", "repetition_penalty", "vocab_mask", "", "attention_mask"]
    node = helper.make_node(
        "BeamSearch", names, ["sequences", "sequences_scores"], domain="com.microsoft",
        eos_token_id=EOS, pad_token_id=PAD, decoder_start_token_id=BOS, model_type=1,
        no_repeat_ngram_size=0, early_stopping=1, encoder=enc.graph, decoder=dec.graph,
    )  # fmt: skip
    int32, scalar = TensorProto.INT32, [1]
    inputs = [
        helper.make_tensor_value_info("input_ids", int32, ["batch", "src"]),
        *(helper.make_tensor_value_info(n, int32, scalar) for n in names[1:5]),
        helper.make_tensor_value_info("length_penalty", TensorProto.FLOAT, scalar),
        helper.make_tensor_value_info("repetition_penalty", TensorProto.FLOAT, scalar),
        helper.make_tensor_value_info("vocab_mask", int32, [model.embedding.weight.size(0)]),
        helper.make_tensor_value_info("attention_mask", int32, ["batch", "src"]),
    ]
    outputs = [
        helper.make_tensor_value_info("sequences", int32, ["batch", "n", "length"]),
        helper.make_tensor_value_info("sequences_scores", TensorProto.FLOAT, ["batch", "n"]),
    ]
    graph = helper.make_graph([node], "wtnmt search", inputs, outputs)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    search = helper.make_model(graph, producer_name="wtnmt", opset_imports=opsets)
    search.ir_version = enc.ir_version
    onnx.save(search, str(directory / "search.onnx"))
    return directory / "search.onnx"


def main() -> None:
    import onnxruntime as ort

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--beams", default="1,4,5")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    translator = Translator.load(args.run)
    d = translator.config.decode
    # the operator ranks as fairseq does: the run's search in that form
    translator.config = dataclasses.replace(
        translator.config, decode=dataclasses.replace(d, length_penalty_form="fairseq")
    )
    sources = split_pairs(args.run, "test")[0][: args.sentences]
    ids = translator.encode(sources)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    with tempfile.TemporaryDirectory() as tmp:
        session = ort.InferenceSession(str(export(translator, Path(tmp))), options)
    width = max(map(len, ids)) + 1
    x = np.zeros((len(ids), width), np.int32)
    for i, seq in enumerate(ids):
        x[i, : len(seq) + 1] = [*seq, EOS]
    vocab_mask = np.ones(translator.model.embedding.weight.size(0), np.int32)
    vocab_mask[[PAD, BOS]] = 0
    for beam in map(int, args.beams.split(",")):
        feed = {
            "input_ids": x,
            "max_length": np.array([translator.model.max_positions + 1], np.int32),
            "min_length": np.array([1], np.int32),
            "num_beams": np.array([beam], np.int32),
            "num_return_sequences": np.array([1], np.int32),
            "length_penalty": np.array([d.length_penalty], np.float32),
            "repetition_penalty": np.array([1.0], np.float32),
            "vocab_mask": vocab_mask,
            "attention_mask": (x != PAD).astype(np.int32),
        }
        translator.translate_ids(ids[:8], beam=beam)  # warm-up (packing, allocator), untimed
        session.run(
            None, {**feed, "input_ids": x[:8], "attention_mask": feed["attention_mask"][:8]}
        )
        start = time.perf_counter()
        ours = translator.translate_ids(ids, beam=beam)
        torch_seconds = time.perf_counter() - start
        start = time.perf_counter()
        sequences, scores = session.run(None, feed)
        ort_seconds = time.perf_counter() - start
        same, worst = 0, 0.0
        for i, nbest in enumerate(ours):
            theirs = [int(t) for t in sequences[i, 0] if t not in (PAD, BOS, EOS)]
            same += theirs == list(nbest[0].ids)
            if beam > 1:  # the operator's greedy (one beam) reports no normalised score
                worst = max(worst, abs(float(scores[i, 0]) - nbest[0].score))
        print(
            f"beam {beam}: tokens identical in {same} of {len(ids)}; largest score difference "
            f"{worst:.1e}; PyTorch engine {torch_seconds:.2f} s, ONNX Runtime BeamSearch "
            f"{ort_seconds:.2f} s ({torch_seconds / ort_seconds:.2f}×), {args.threads} threads"
        )


if __name__ == "__main__":
    main()
