"""ONNX Runtime's int8 graphs checked product by product: each ``MatMulInteger`` (the product
``quantize_dynamic`` made of a MatMul or Gemm) against int8_oracle's float64 simulation of
the same dynamic quantisation of its own input, as checked_int8 checks PyTorch's kernels.

``instrumented(net)`` gives the network's two sessions again, each made from its graph with
every quantised product's float input (what its DynamicQuantizeLinear reads) and float output
(the dequantising Mul's) as extra outputs, which it records at every run: so a whole search can
run on it, and no product is compared against another engine's diverged path (a value float32
puts on the other side of a quantisation step in one engine and not in the other moves every
later activation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from int8_oracle import TIE, quantize_activations
from wtnmt.decode.onnx_engine import OnnxNetwork, _session
from wtnmt.export.onnx import graph_file


@dataclass
class Product:
    """One quantised product of a graph: its input and output names, its int8 weight [in, out]
    and per-output scales, and every (x, y) a run gave it."""

    x: str
    y: str
    weight: np.ndarray
    scale: np.ndarray
    seen: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)


def _products(graph: onnx.GraphProto) -> list[Product]:
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    products = []
    for node in graph.node:
        if node.op_type != "MatMulInteger":
            continue
        quantizer = producer[node.input[0]]
        assert quantizer.op_type == "DynamicQuantizeLinear", quantizer.op_type
        weight = inits[node.input[1]]
        assert not inits[node.input[3]].any()  # symmetric weights
        (cast,) = consumers[node.output[0]]
        (mul,) = consumers[cast.output[0]]
        assert cast.op_type == "Cast" and mul.op_type == "Mul", (cast.op_type, mul.op_type)
        scales = producer[mul.input[1]]  # the activations' scale × the weights'
        assert scales.op_type == "Mul", scales.op_type
        (scale,) = [inits[name] for name in scales.input if name in inits]
        products.append(Product(quantizer.input[0], mul.output[0], weight, scale))
    return products


class _Recording:
    """An ONNX Runtime session over the instrumented graph that returns what the original's
    ``run`` returns and keeps each product's (x, y)."""

    def __init__(self, path: Path, products: list[Product], outputs: list[str], threads: int):
        self.session = _session(path, threads)
        self.products = products
        self.outputs = outputs

    def run(self, names, feeds):  # type: ignore[no-untyped-def]
        extra = [name for p in self.products for name in (p.x, p.y)]
        out = self.session.run([*self.outputs, *extra], feeds)
        values = out[len(self.outputs) :]
        for i, p in enumerate(self.products):
            p.seen.append((values[2 * i], values[2 * i + 1]))
        return out[: len(self.outputs)]


def instrumented(net: OnnxNetwork, directory: Path, work: Path) -> list[Product]:
    """Replace ``net``'s int8 sessions by recording ones (their graphs written under ``work``);
    returns every quantised product of both graphs, to be checked once they have run."""
    everything = []
    for attribute, name in (("encoder", "encoder"), ("step", "decoder_step")):
        model = onnx.load(str(directory / graph_file(name, "int8")))
        outputs = [o.name for o in model.graph.output]
        products = _products(model.graph)
        for p in products:
            for value in (p.x, p.y):
                model.graph.output.append(onnx.helper.make_empty_tensor_value_info(value))
                model.graph.output[-1].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
        path = work / f"{name}.recorded.onnx"
        onnx.save(model, str(path))
        setattr(net, attribute, _Recording(path, products, outputs, net.threads))
        everything += products
    return everything


def beyond_simulation(p: Product, x: np.ndarray, y: np.ndarray, activations: int = 255) -> float:
    """How far ONNX Runtime's product ``y`` of ``x`` lies from the simulation of the same
    quantisation (its own int8 weights and scales; activations onto 0…``activations``), beyond
    float32's rounding of ties (one step of an activation within TIE of half a step), relative
    to the largest expected value."""
    flat = torch.from_numpy(x).double().reshape(-1, x.shape[-1])
    qx, sx, zx = quantize_activations(flat, qmax=activations)
    qw = torch.from_numpy(p.weight.copy()).double()  # [in, out]
    sw = torch.from_numpy(p.scale.copy()).double()
    expected = ((qx - zx) @ qw) * (sx * sw)
    steps = flat / sx
    ties = ((steps - steps.floor() - 0.5).abs() < TIE).double()
    slack = (ties @ qw.abs()) * (sx * sw)
    got = torch.from_numpy(y).double().reshape(expected.shape)
    beyond = ((got - expected).abs() - slack).clamp_min(0)
    return beyond.max().item() / max(expected.abs().max().item(), 1e-12)


__all__ = ["Product", "beyond_simulation", "instrumented"]
