"""Argument types and the options several commands share, for wtnmt/cli.py."""

from __future__ import annotations

import argparse


def at_least_one(text: str) -> int:
    """An argparse type: an integer of at least 1 (beam sizes, samples, threads)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return value


def positive_number(text: str) -> float:
    """An argparse type: a finite number above 0 (minutes of a budget)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number above 0")
    return value


def add_quantize(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quantize",
        default="none",
        choices=["none", "int8"],
        help="int8: decode with int8 linear layers (CPU; faster, approximate; default none)",
    )


def add_engine(p: argparse.ArgumentParser, default: str = "pytorch") -> None:
    p.add_argument(
        "--engine",
        default=default,
        choices=["auto", "pytorch", "native", "onnxruntime"],
        help="what runs the search: PyTorch; native, the search and decoder step in C++ "
        "(CPU; compiled on first use: a C++ compiler and pip install 'wtnmt[native]'); auto, "
        "native where it can run here, PyTorch otherwise; or ONNX Runtime on the run's ONNX "
        f"export (RUN/onnx, made on first use; CPU; pip install 'wtnmt[onnx]'; default {default})",
    )


def add_length_penalty(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lenpen",
        type=float,
        metavar="ALPHA",
        help="length penalty α of the beam's ranking (default: the run's "
        "decode.length_penalty; 0: no normalization)",
    )
    p.add_argument(
        "--lenpen-form",
        choices=["gnmt", "fairseq"],
        help="((5 + |y|) / 6)^α (gnmt) or |y|^α (fairseq) (default: the run's "
        "decode.length_penalty_form)",
    )
    p.add_argument(
        "--max-len-a",
        type=float,
        metavar="A",
        help="a translation has at most A·|x| + B tokens, |x| the source's (default: the run's "
        "decode.max_len_a; 0 to 64)",
    )
    p.add_argument(
        "--max-len-b",
        type=int,
        metavar="B",
        help="B of that bound (default: the run's decode.max_len_b; 0 to 65,536)",
    )


def size(text: str) -> int:
    """Bytes, with an optional K, M or G (powers of 1024)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    number, unit = (text[:-1], units[text[-1].upper()]) if text[-1:].upper() in units else (text, 1)
    try:
        value = int(float(number) * unit)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a size such as 16M or 500000") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0")
    return value


def add_ensemble(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ensemble",
        nargs="+",
        metavar="RUN",
        help="decode with RUN's model and these runs' together, each step's probabilities "
        "averaged (fairseq's; the runs share RUN's vocabularies; the native or PyTorch engine)",
    )
    p.add_argument(
        "--ensemble-weights",
        metavar="W,W,…",
        help="the models' weights in that average, RUN's first (default: equal)",
    )
