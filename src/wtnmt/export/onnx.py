"""`wtnmt export onnx RUN`: the run's network as two ONNX graphs, for ONNX Runtime.

    RUN/onnx/encoder.onnx         src [B, S] → what every decoder layer's cross-attention reads
    RUN/onnx/decoder_step.onnx    one decoder step against the cache (export/graphs.py)
    RUN/onnx/export.json          what ties the files to the run: the weights' and the
                                  vocabulary's sha256, the shapes, each graph's sha256
    RUN/onnx/*.int8.onnx          with ``quantize="int8"``: the same graphs, their products
                                  dynamically quantised (int8 weights per output channel)

Search (greedy, beam, length penalty, n-best, constraints) stays the toolkit's own code
(decode/onnx_engine.py); only the network runs in ONNX Runtime. Every model the toolkit
trains exports: both model kinds, post- and pre-norm, multi-head or weighted decoder
self-attention, learned or sinusoidal positions, transparent attention.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal

import torch

from wtnmt.data.corpora import sha256_of
from wtnmt.data.vocab import holds_joint, vocabularies_sha256, vocabulary_files
from wtnmt.export.files import (
    GRAPHS,
    META,
    ExportError,
    check_target,
    graph_file,
    remove_stale_exports,
)
from wtnmt.export.graphs import DecoderStepGraph, EncoderGraph
from wtnmt.model.speed import plain_math
from wtnmt.rundir import load_run
from wtnmt.runtime import cpu_has_vnni
from wtnmt.safe_files import atomic_write, current_umask

FORMAT = 1  # of export.json; a reader refuses another
OPSET = 18


@contextlib.contextmanager
def _quiet():  # type: ignore[no-untyped-def]
    """The exporter's and the quantiser's progress lines, warnings and log records hidden
    (a translation on standard output must stay clean); errors still raise."""
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with (
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(before)


def _require_exporter() -> None:
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 6):  # torch.onnx.export(dynamo=True, dynamic_shapes=...) as used here
        raise ExportError(
            f"exporting to ONNX needs torch 2.6 or newer (this is {torch.__version__}); the "
            "runs themselves are readable by any torch>=2.4"
        )
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise ExportError(
            "exporting to ONNX needs the onnx and onnxscript packages: pip install 'wtnmt[onnx]'"
        ) from None


def _shapes(model: torch.nn.Module) -> dict[str, int]:
    """What the engine needs to know of the graphs. ``heads`` and ``head_dim`` shape the
    decoder self-attention cache it keeps (the cross-attention keys come out of the encoder
    graph shaped, with as many heads as a pruned model's layer kept)."""
    attention = model.decoder_layers[0].self_attn.attn
    heads = attention.heads
    return {
        "layers": len(model.decoder_layers),
        "heads": heads,
        "head_dim": attention.proj.weight.size(0) // (3 * heads),
        "vocab_size": model.embedding.weight.size(0),
        "max_positions": model.positions.max_positions,
        "pad_id": model.pad_id,
    }


def _names(layers: int) -> tuple[list[str], list[str], list[str], list[str]]:
    """Input and output names of the encoder and the decoder step."""
    enc_out = ["cross_bias"] + [f"{n}.{i}" for i in range(layers) for n in ("cross_k", "cross_v")]
    step_in = ["tokens", "position", "self_bias", "cross_bias"] + [
        f"{n}.{i}" for i in range(layers) for n in ("cross_k", "cross_v", "self_k", "self_v")
    ]
    step_out = ["lprobs"] + [f"{n}.{i}" for i in range(layers) for n in ("new_k", "new_v")]
    return ["src"], enc_out, step_in, step_out


def export_graphs(
    model: torch.nn.Module, directory: Path, say: Callable[[str], None] = lambda _: None
) -> dict[str, int]:
    """Trace the two graphs of ``model`` into ``directory`` (the exporter's chatter hidden;
    ``say`` says each step and its seconds); returns their shapes (layers, heads, head_dim,
    vocab_size, max_positions, pad_id)."""
    from torch.export import Dim

    shape = _shapes(model)
    layers, h, dk = shape["layers"], shape["heads"], shape["head_dim"]
    enc_in, enc_out, step_in, step_out = _names(layers)
    batch, group = Dim("batch"), Dim("group")
    src_len, slots = Dim("src_len", max=shape["max_positions"]), Dim("slots")
    # example sizes above 1 (an export specialises sizes 0 and 1) and different from one another
    b, s, g, c = 2, 7, 3, 12
    src = torch.full((b, s), 5, dtype=torch.long)
    src[1, 5:] = model.pad_id
    encoder, step = EncoderGraph(model).eval(), DecoderStepGraph(model).eval()
    start = time.perf_counter()
    with torch.no_grad(), plain_math(), _quiet():
        torch.onnx.export(
            encoder,
            (src,),
            str(directory / "encoder.onnx"),
            input_names=enc_in,
            output_names=enc_out,
            dynamic_shapes=({0: batch, 1: src_len},),
            opset_version=OPSET,
            external_data=False,
            verbose=False,
        )
        say(f"  the encoder traced ({time.perf_counter() - start:.0f} s); the decoder step next")
        start = time.perf_counter()
        cross = encoder(src)
        caches: list[torch.Tensor] = []
        per_layer: list[dict[int, Any]] = []
        for i in range(layers):
            caches += [cross[1 + 2 * i], cross[2 + 2 * i]]
            caches += [torch.zeros(h, b, dk, c), torch.zeros(h, b, c, dk)]
            per_layer += [{1: batch, 3: src_len}, {1: batch, 2: src_len}]
            per_layer += [{1: batch, 3: slots}, {1: batch, 2: slots}]
        tokens = torch.full((b, g), 5, dtype=torch.long)
        inputs = (tokens, torch.tensor([3]), torch.zeros(b, g, c), cross[0], *caches)
        torch.onnx.export(
            step,
            inputs,
            str(directory / "decoder_step.onnx"),
            input_names=step_in,
            output_names=step_out,
            dynamic_shapes=(
                {0: batch, 1: group},
                None,
                {0: batch, 1: group, 2: slots},
                {0: batch, 2: src_len},
                tuple(per_layer),
            ),
            opset_version=OPSET,
            external_data=False,
            verbose=False,
        )
    say(f"  the decoder step traced ({time.perf_counter() - start:.0f} s)")
    return shape


def _foldable(source: Path, target: Path) -> None:
    """``source`` made ready for dynamic quantisation into ``target``: constants folded by ONNX
    Runtime's basic (portable) optimisations, so that weights computed from parameters (κ·W,
    α·W2) become initializers, and each Gemm with a constant weight rewritten as MatMul (+ Add),
    which the dynamic quantiser takes (it leaves Gemm in float32)."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(target)
    options.log_severity_level = 3
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    model = onnx.load(str(target))
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    nodes = []
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weight = inits.get(node.input[1]) if node.op_type == "Gemm" else None
        plain = attrs.get("transA", 0) == 0 and attrs.get("alpha", 1.0) == 1.0
        if weight is None or not plain or attrs.get("beta", 1.0) not in (0.0, 1.0):
            nodes.append(node)
            continue
        w = numpy_helper.to_array(weight)
        if attrs.get("transB", 0):
            w = np.ascontiguousarray(w.T)
        name = f"{node.name}.weight_t"
        graph.initializer.append(numpy_helper.from_array(w, name))
        bias = node.input[2] if len(node.input) > 2 and attrs.get("beta", 1.0) else ""
        product = f"{node.output[0]}.product" if bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], name], [product], name=node.name))
        if bias:
            nodes.append(helper.make_node("Add", [product, bias], [node.output[0]]))
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, str(target))


def _batched_products(path: Path) -> list[str]:
    """The MatMul nodes whose constant operand has more than 2 dimensions: the Weighted
    Transformer's per-branch products [M, Dk, F/M], which ONNX Runtime's per-channel int8
    MatMul does not take (their weights stay float32, as in the PyTorch engine's int8)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    ranks = {init.name: len(init.dims) for init in graph.initializer}
    return [
        node.name
        for node in graph.node
        if node.op_type == "MatMul" and ranks.get(node.input[1], 2) != 2
    ]


def quantize_graphs(directory: Path, *, reduce_range: bool | None = None) -> dict[str, str]:
    """ONNX Runtime's dynamic quantisation of both graphs' products (MatMul and Gemm with a
    constant weight: int8 weights per output channel, activations quantised per call);
    ``reduce_range`` (7-bit weights) by default where the CPU has no VNNI.
    Returns the new files' sha256 by name."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if reduce_range is None:
        reduce_range = not cpu_has_vnni()
    digests = {}
    for name in GRAPHS:
        target = directory / graph_file(name, "int8")
        source = directory / f".{name}.foldable.onnx"
        with _quiet():
            _foldable(directory / graph_file(name, "none"), source)
            quantize_dynamic(
                str(source),
                str(target),
                per_channel=True,
                reduce_range=reduce_range,
                weight_type=QuantType.QInt8,
                op_types_to_quantize=["MatMul", "Gemm"],
                nodes_to_exclude=_batched_products(source),
                extra_options={"MatMulConstBOnly": True},
            )
        source.unlink()
        digests[target.name] = sha256_of(target)
    return digests


def export_onnx(
    run: str | Path,
    out: str | Path | None = None,
    *,
    weights: str = "model.safetensors",
    quantize: Literal["none", "int8"] = "none",
    force: bool = False,
    say: Callable[[str], None] | None = None,
) -> Path:
    """Export the run's network into ``out`` (default RUN/onnx) and return it.

    ``out`` must be new, empty, or an export made by this toolkit, which is replaced only
    with ``force``. The files are written to a temporary directory beside ``out`` and moved
    into place at the end: an interrupted export leaves nothing half-written.
    """
    _require_exporter()
    run = Path(run)
    target = Path(out) if out is not None else run / "onnx"
    check_target(target, force)
    config, _, model = load_run(run, weights=weights)
    model.eval()
    if say is not None:
        say(f"exporting {run} to ONNX: {target} (a minute or less)")
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_exports(target)
    work = Path(
        tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp")
    )
    work.chmod(0o777 & ~current_umask())  # as mkdir would make it, not mkdtemp's 0700
    try:
        export_graphs(model, work, say or (lambda _: None))
        files = {graph_file(n, "none"): sha256_of(work / graph_file(n, "none")) for n in GRAPHS}
        if quantize == "int8":
            if say is not None:
                say("  quantising both graphs to int8")
            files.update(quantize_graphs(work))
        meta = {
            "format": FORMAT,
            "wtnmt": version("wtnmt"),
            "run": str(run.resolve()),
            "weights": weights,
            "weights_sha256": sha256_of(run / weights),
            "vocab_sha256": vocabularies_sha256(run, config.data.joint_vocab),
            "model": {"attention": config.model.attention, "norm": config.model.norm},
            **_shapes(model),
            "opset": OPSET,
            "files": files,
        }
        atomic_write(work / META, (json.dumps(meta, indent=2) + "\n").encode())
        if target.exists():  # our own export (or one that lost its META), replaced as asked
            shutil.rmtree(target)
        work.rename(target)
    finally:
        if work.exists():
            shutil.rmtree(work)
    return target


def again(directory: Path, run: Path) -> str:
    """The command that makes the export in ``directory`` anew (``--force`` is export's)."""
    out = "" if directory == run / "onnx" else f" --out {directory}"
    return f"`wtnmt export onnx {run}{out} --force`"


def read_export(directory: str | Path, run: str | Path, *, weights: str, quantize: str) -> dict:
    """The metadata of the export in ``directory``, checked against the run's weights and
    vocabulary and against its files' sha256; every mismatch is an ExportError naming it."""
    directory, run = Path(directory), Path(run)
    path = directory / META
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise ExportError(f"{directory}: no {META}; run `wtnmt export onnx {run}`") from None
    except (OSError, ValueError) as e:
        raise ExportError(
            f"{path}: unreadable ({e}; damaged): export again with {again(directory, run)}"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ExportError(
            f"{path}: not an export of format {FORMAT}; export again with {again(directory, run)}"
        )
    joint = holds_joint(run)
    current = {
        "weights_sha256": (run / weights, lambda: sha256_of(run / weights)),
        "vocab_sha256": (
            run / vocabulary_files(joint)[-1],
            lambda: vocabularies_sha256(run, joint),
        ),
    }
    for key, (file, digest) in current.items():
        if meta.get(key) != digest():
            raise ExportError(
                f"{directory}: exported from another {file.name} than {file}'s (sha256 "
                f"differs); export again with {again(directory, run)}"
            )
    files = meta.get("files", {})
    for name in GRAPHS:
        file = graph_file(name, quantize)
        if file not in files or not (directory / file).is_file():
            raise ExportError(f"{directory}: no {file}")
        if sha256_of(directory / file) != files[file]:
            raise ExportError(f"{directory / file}: damaged (sha256 differs from {META}'s)")
    return meta


def add_int8(directory: str | Path) -> None:
    """Quantise an existing float32 export in place (its metadata gains the int8 files)."""
    directory = Path(directory)
    meta = json.loads((directory / META).read_text())
    meta["files"].update(quantize_graphs(directory))
    atomic_write(directory / META, (json.dumps(meta, indent=2) + "\n").encode())


__all__ = [
    "GRAPHS",
    "META",
    "ExportError",
    "add_int8",
    "export_graphs",
    "export_onnx",
    "graph_file",
    "quantize_graphs",
    "read_export",
]
