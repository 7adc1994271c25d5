"""The network in ONNX Runtime, behind the interface search reads (decode/search.py):
``pad_id``, ``max_positions`` and ``stepper(src, steps=, group=)``.

Only the network runs in ONNX Runtime (the graphs of export/onnx.py); greedy and beam search
stay the toolkit's code. The decoder's own keys and values live here, in the layout of
export/graphs.py: per layer and sentence C slots (steps × slots a step), written once at
their step and never copied as beam search reorders hypotheses, which reach their own prefix
through a bias rebuilt each step from their paths. The buffers grow by doubling.

ONNX Runtime and PyTorch each keep a thread pool: in one process they would fight for the
cores, so ONNX Runtime gets ``threads`` intra-op threads and no spinning.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from wtnmt.export.onnx import ExportError, graph_file, read_export

_FIRST_CAPACITY = 16  # steps the self-attention buffers hold at first


def _session(path: Path, threads: int):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's own exception types
        reason = str(e).splitlines()[0]
        raise ExportError(f"{path}: ONNX Runtime cannot load it ({reason})") from None


class OnnxNetwork:
    """A network's two exported graphs in ONNX Runtime (``open`` checks them against a run).

    ``shapes``: the export's metadata (layers, heads, head_dim, pad_id, max_positions).
    """

    def __init__(
        self,
        encoder: str | Path,
        step: str | Path,
        shapes: dict,
        *,
        quantize: str = "none",
        threads: int | None = None,
    ) -> None:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            raise ExportError(
                "the onnxruntime engine needs the onnxruntime package: pip install 'wtnmt[onnx]'"
            ) from None
        self.quantize = quantize
        self.threads = threads or torch.get_num_threads()
        self.encoder = _session(Path(encoder), self.threads)
        self.step = _session(Path(step), self.threads)
        self.layers, self.heads, self.head_dim = (
            shapes["layers"],
            shapes["heads"],
            shapes["head_dim"],
        )
        self.pad_id, self.max_positions = shapes["pad_id"], shapes["max_positions"]

    @classmethod
    def open(
        cls,
        directory: str | Path,
        run: str | Path,
        *,
        weights: str = "model.safetensors",
        quantize: str = "none",
        threads: int | None = None,
    ) -> OnnxNetwork:
        """The export in ``directory``, checked against ``run``'s weights and vocabulary."""
        directory = Path(directory)
        meta = read_export(directory, run, weights=weights, quantize=quantize)
        return cls(
            directory / graph_file("encoder", quantize),
            directory / graph_file("decoder_step", quantize),
            meta,
            quantize=quantize,
            threads=threads,
        )

    def stepper(self, src: Tensor, *, steps: int, group: int) -> OnnxStepper:
        return OnnxStepper(self, src, steps=steps, group=group)


class OnnxStepper:
    """Next-token log-probabilities for hypotheses numbered in sentence order (G a sentence),
    as search's ``_Stepper``: ``reorder`` keeps, reorders or multiplies them."""

    def __init__(self, net: OnnxNetwork, src: Tensor, *, steps: int, group: int) -> None:
        self.net = net
        out = net.encoder.run(None, {"src": src.cpu().numpy()})
        self.cross_bias = out[0]  # [B, 1, S]
        self.cross = out[1:]  # per layer: keys [H, B, Dk, S], values [H, B, S, Dk]
        self.width = max(1, group)  # slots a step
        self.capacity = max(1, min(steps, _FIRST_CAPACITY))  # steps the buffers hold
        self.max_steps = max(steps, 1)
        b, h, dk, c = self.cross_bias.shape[0], net.heads, net.head_dim, self.capacity * self.width
        self.self_k = [np.zeros((h, b, dk, c), np.float32) for _ in range(net.layers)]
        self.self_v = [np.zeros((h, b, c, dk), np.float32) for _ in range(net.layers)]
        self.path = np.zeros((b, 0), np.int64)  # [N, t] the slot of each step on a prefix
        self.t = 0

    def reorder(self, index: Tensor, sentences: Tensor | None) -> None:
        """Keep hypotheses ``index``; ``sentences``: the source sentences still searched."""
        if self.width > 1:
            self.path = self.path[index.cpu().numpy()]
        if sentences is not None:
            keep = sentences.cpu().numpy()
            self.cross_bias = self.cross_bias[keep]
            self.cross = [a[:, keep] for a in self.cross]
            self.self_k = [a[:, keep] for a in self.self_k]
            self.self_v = [a[:, keep] for a in self.self_v]

    def _grow(self) -> None:
        """Double the steps the buffers hold (a slot's column, τ·W + g, stays where it is)."""
        self.capacity = min(2 * self.capacity, max(self.max_steps, self.t + 1))
        c = self.capacity * self.width
        self.self_k = [_widen(a, c, axis=3) for a in self.self_k]
        self.self_v = [_widen(a, c, axis=2) for a in self.self_v]

    def _bias(self, b: int, g: int) -> np.ndarray:
        """[B, G, C]: 0 on the slots of each hypothesis' prefix, −inf elsewhere."""
        t, w, c = self.t, self.width, self.capacity * self.width
        bias = np.full((b, g, c), -np.inf, np.float32)
        if w == 1:  # one hypothesis a sentence: every written slot is its own
            bias[:, :, :t] = 0.0
        elif t > 0:
            rows = np.arange(b * g)[:, None]
            cols = np.arange(t)[None, :] * w + self.path
            bias.reshape(b * g, c)[rows, cols] = 0.0
        return bias

    def __call__(self, prefix: Tensor) -> Tensor:
        """prefix [N, t] (BOS first) → log-probabilities of the next token [N, V]."""
        n, b = prefix.size(0), self.cross_bias.shape[0]
        g = n // b
        if self.t >= self.capacity:
            self._grow()
        feeds = {
            "tokens": prefix[:, -1].reshape(b, g).cpu().numpy(),
            "position": np.array([self.t], np.int64),
            "self_bias": self._bias(b, g),
            "cross_bias": self.cross_bias,
        }
        for i in range(self.net.layers):
            feeds[f"cross_k.{i}"], feeds[f"cross_v.{i}"] = self.cross[2 * i], self.cross[2 * i + 1]
            feeds[f"self_k.{i}"], feeds[f"self_v.{i}"] = self.self_k[i], self.self_v[i]
        out = self.net.step.run(None, feeds)
        start = self.t * self.width
        for i in range(self.net.layers):
            new_k, new_v = out[1 + 2 * i], out[2 + 2 * i]  # [H, B, G, Dk]
            self.self_k[i][:, :, :, start : start + g] = new_k.transpose(0, 1, 3, 2)
            self.self_v[i][:, :, start : start + g] = new_v
        if self.width > 1:  # (one slot a step: every written slot is each hypothesis' own)
            slot = np.arange(n, dtype=np.int64)[:, None] % g
            self.path = np.concatenate([self.path, slot], axis=1)
        self.t += 1
        return torch.from_numpy(out[0])


def _widen(a: np.ndarray, size: int, *, axis: int) -> np.ndarray:
    shape = list(a.shape)
    shape[axis] = size
    wider = np.zeros(shape, a.dtype)
    index = [slice(None)] * a.ndim
    index[axis] = slice(0, a.shape[axis])
    wider[tuple(index)] = a
    return wider


def load_network(
    run: str | Path,
    *,
    directory: str | Path | None = None,
    weights: str = "model.safetensors",
    quantize: str = "none",
    threads: int | None = None,
    say: Callable[[str], None] = print,
) -> OnnxNetwork:
    """The run's network in ONNX Runtime, from ``directory`` (default RUN/onnx). Where the
    default directory has no export yet, or no int8 graphs when they are asked for, they are
    made first (and ``say`` says so); an export of other weights is refused."""
    from wtnmt.export.files import META, lost_metadata
    from wtnmt.export.onnx import add_int8, export_onnx

    run = Path(run)
    if directory is None:
        directory = run / "onnx"
        if lost_metadata(directory):
            raise ExportError(
                f"{directory}: an export without its {META} (damaged): make it again with "
                f"`wtnmt export onnx {run} --force`"
            )
        if not (directory / META).is_file():
            say(f"exporting {run} to ONNX on first use: {directory} (once)")
            export_onnx(run, directory, weights=weights, quantize=quantize)
        elif quantize != "none" and not (directory / graph_file("encoder", quantize)).is_file():
            read_export(directory, run, weights=weights, quantize="none")  # ours, current
            say(f"quantising {directory} to {quantize} on first use (once)")
            add_int8(directory)
    return OnnxNetwork.open(directory, run, weights=weights, quantize=quantize, threads=threads)


__all__ = ["OnnxNetwork", "OnnxStepper", "load_network"]
