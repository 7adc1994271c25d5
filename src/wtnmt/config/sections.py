"""The sections of a run config, each a frozen dataclass that validates itself: every value is
checked when a section is made, and a bad one raises :class:`ConfigError` naming the dotted
key, the value and what is allowed. ``model`` is in config/model.py, a pruned model's
``model.kept_branches`` and ``prune`` record in config/pruning.py, the checks in
config/checks.py."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Literal

from wtnmt.config.checks import greater, positive, probability
from wtnmt.config.errors import ConfigError
from wtnmt.config.model import ModelConfig
from wtnmt.config.pruning import PruneRecord

_LANG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataConfig:
    """Where the parallel data comes from and how it becomes subword ids."""

    corpus: str | None = "tatoeba-deu-eng"  # a named corpus, or null with src/tgt/tsv files
    corpus_dir: str | None = None  # explicit directory of the named corpus's files
    src_lang: str = "en"  # source language: names the files (valid.en) and the corpus side
    tgt_lang: str = "de"  # target language, as src_lang
    # your own training source file (one sentence a line; with train_tgt, corpus: null)
    train_src: str | None = None
    train_tgt: str | None = None  # its line-aligned target file
    train_tsv: str | None = None  # or both sides in one tab-separated file (corpus: null)
    valid_src: str | None = None  # dev source file (else dev is held out of train)
    valid_tgt: str | None = None  # dev target file
    test_src: str | None = None  # test source file (else test is held out of train)
    test_tgt: str | None = None  # test target file
    # where prepare writes the ids and vocabulary (relative to the working directory);
    # {options}: nothing where every build option below is the default, else a digest of
    # those that differ, so that runs with other settings never rebuild each other's folder
    prepared_dir: str = "data-bin/{corpus}.{src_lang}-{tgt_lang}{options}"
    # Tatoeba has no standard split: a seeded split by unique English sentence.
    split_seed: int = 1
    train_size: int | None = None  # None: everything not in dev/test
    valid_size: int = 1000  # pairs held out for dev where the corpus has no dev set
    test_size: int = 1000  # pairs held out for test where the corpus has no test set
    max_words: int | None = None  # keep only pairs whose sides have at most this many words
    # Subword vocabulary (sentencepiece): one for both languages, its embedding shared by
    # source, target and output (paper §4.1); false: one a language (vocab_size pieces
    # each), the source's embedding its own and the target's tied to the output projection
    joint_vocab: bool = True
    vocab_size: int = 8000  # pieces in the vocabulary (in each, with joint_vocab: false)
    # a run (or prepared data folder) whose SentencePiece model(s) to encode with instead of
    # training new ones (data.vocab_size then unused): what a fine-tune of that run needs, and
    # what train.init_from sets when this is null
    vocab_from: str | None = None
    spm_model_type: Literal["bpe", "unigram"] = "bpe"  # sentencepiece's model type
    character_coverage: float = 1.0  # characters the vocabulary covers (sentencepiece's; 1.0: all)
    spm_seed: int = 1  # sentencepiece's seed
    spm_max_sentences: int = 2_000_000  # sentences sampled to train the vocabulary
    # Cleaning (train split): over-long pairs and duplicates are dropped and counted
    max_tokens_per_side: int = 250
    # longer side at most this many times the shorter (Moses' clean-corpus)
    max_length_ratio: float = 3.0
    drop_duplicates: bool = True  # drop exact repeats of an earlier pair

    def __post_init__(self) -> None:
        positive(self, "data", "vocab_size", "valid_size", "test_size", "max_tokens_per_side")
        positive(self, "data", "spm_max_sentences")
        if self.train_size is not None:
            positive(self, "data", "train_size")
        if self.max_words is not None:
            positive(self, "data", "max_words")
        if not 0.0 < self.character_coverage <= 1.0:
            raise ConfigError(
                f"data.character_coverage={self.character_coverage} must be in (0, 1]"
            )
        if self.max_length_ratio < 1.0:
            raise ConfigError(f"data.max_length_ratio={self.max_length_ratio} must be >= 1")
        sources = [
            name
            for name, given in (
                ("data.corpus", self.corpus is not None),
                (
                    "data.train_src/train_tgt",
                    self.train_src is not None or self.train_tgt is not None,
                ),
                ("data.train_tsv", self.train_tsv is not None),
            )
            if given
        ]
        if len(sources) != 1:
            raise ConfigError(
                "set exactly one source of training data: data.corpus, data.train_src with "
                f"data.train_tgt, or data.train_tsv (got {', '.join(sources) or 'none'})"
            )
        if self.src_lang == self.tgt_lang:
            raise ConfigError(
                f"data.src_lang and data.tgt_lang are both {self.src_lang!r}: they name the two "
                f"sides' files (valid.{self.src_lang}, test.{self.src_lang}), so one would "
                f"overwrite the other; give them different names, e.g. {self.src_lang} and "
                f"{self.src_lang}2"
            )
        for key in ("src_lang", "tgt_lang"):  # they name files: valid.<lang>
            lang = getattr(self, key)
            if not _LANG.match(lang):
                raise ConfigError(
                    f"data.{key}={lang!r}: a language name is letters, digits, '_' and '-' "
                    f"(it names the files valid.{{lang}} and test.{{lang}})"
                )
        for side in ("train", "valid", "test"):
            src, tgt = getattr(self, f"{side}_src"), getattr(self, f"{side}_tgt")
            if (src is None) != (tgt is None):
                raise ConfigError(f"data.{side}_src and data.{side}_tgt go together: set both")

    def prepared_path(self) -> Path:
        """``prepared_dir`` with its {corpus}, {src_lang}, {tgt_lang} and {options} filled in."""
        return Path(
            self.prepared_dir.format(
                corpus=self.corpus or "custom",
                src_lang=self.src_lang,
                tgt_lang=self.tgt_lang,
                options=self.options_suffix(),
            )
        )

    def options_suffix(self) -> str:
        """``""`` where every option that changes what prepare builds (beside the corpus and
        the languages, which the folder's name says) is the default; else ``.`` and eight hex
        digits of a hash of those that differ (files: their paths)."""
        named = {"corpus", "src_lang", "tgt_lang", "prepared_dir", "corpus_dir"}
        changed = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in named and getattr(self, f.name) != f.default
        }
        if not changed:
            return ""
        text = json.dumps(changed, sort_keys=True, default=str)
        return "." + hashlib.sha256(text.encode()).hexdigest()[:8]


@dataclass(frozen=True)
class DisagreementConfig:
    """Disagreement regularization of attention heads (Li et al., 2018)."""

    # Li et al.'s terms to add (none: off)
    terms: tuple[Literal["subspace", "position", "output"], ...] = ()
    # the attention modules they apply to
    modules: tuple[Literal["encoder_self", "decoder_self", "encoder_decoder"], ...] = (
        "encoder_self",
        "decoder_self",
        "encoder_decoder",
    )
    weight: float = 1.0  # λ

    def __post_init__(self) -> None:
        if self.weight < 0:
            raise ConfigError(f"train.disagreement.weight={self.weight} must be >= 0")


@dataclass(frozen=True)
class TrainConfig:
    """The paper's training procedure (§4.1)."""

    seed: int = 1  # seed of the weights' initialisation, dropout and batch order
    max_tokens: int = 4096  # padded source + target tokens per batch
    update_freq: int = 1  # gradient accumulation
    lr_scale: float = 1.0  # the learning rate's scale (the paper's D^-0.5 · schedule times this)
    # the peak learning rate (reached at the end of warm-up), as fairseq's --lr: when set, it
    # replaces lr_scale, which is then peak_lr · √(D · warmup)
    peak_lr: float | None = None
    warmup: int = 4000  # updates of linear warm-up of the weights' learning rate
    # the weights' schedule after warm-up: the paper's inverse square root, or "linear" decay to
    # 0 at the end of the run (max_steps, max_epochs or max_time: fairseq's polynomial_decay),
    # which suits a run that is short by design (the demo); the peak is the same either way
    lr_schedule: Literal["inverse_sqrt", "linear"] = "inverse_sqrt"
    branch_warmup: int = 400  # updates of warm-up of κ, α's learning rate (their own schedule)
    # κ, α: their own schedule (§4.1: warm-up of branch_warmup, scaled by the encoder depth)
    # or "shared": the learning rate of every other weight (an ablation)
    branch_schedule: Literal["own", "shared"] = "own"
    freeze_branch_weights: int = 10_000  # κ, α frozen for the last this-many steps
    freeze_branch_fraction: float = 1 / 6  # the same window for a run bounded by max_time
    # a run bounded by max_time only: warm-up set to this fraction of the updates predicted to
    # fit, from the rate of its first updates, measured again at 10, 20, 40 … updates while
    # the warm-up lasts (κ/α warm-up a tenth of it), so that it ends inside the run on a slow
    # machine too; None: train.warmup and train.branch_warmup
    warmup_fraction: float | None = None
    adam_betas: tuple[float, float] = (0.9, 0.98)  # Adam's β1, β2
    adam_eps: float = 1e-9  # Adam's ε
    label_smoothing: float = 0.1  # ε_ls of the cross-entropy
    clip_norm: float | None = None  # clip the gradient's norm to this (null: no clipping)
    # auto: float32 where the hardware has no bf16; on a CPU with native bf16 (AVX512-BF16, AMX,
    # Arm BF16) whichever of the two a measurement of the run's first batches finds faster
    # (the log says what it measured); bf16 autocast on a GPU that supports it
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    max_steps: int | None = 100_000  # updates to train at most
    max_epochs: int | None = None  # epochs to train at most
    max_time: float | None = None  # seconds of wall clock
    log_every: int = 100  # a metrics line every this many updates
    # validate (and checkpoint) every this many updates; a short run validates at its end
    valid_every: int = 1000
    save_every: int | None = None  # default: valid_every
    # the newest this many checkpoints kept (and the best); `wtnmt average --last N` needs N
    keep_checkpoints: int = 3
    max_nonfinite: int = 10  # consecutive skipped updates that stop the run
    grad_ratio: bool = False  # log r_t = ‖∂L/∂h_1‖ / ‖∂L/∂h_N‖ (Bapna et al., Fig. 1)
    # where to train (auto: a GPU where there is one)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # stop after this many validations without improvement (null: never)
    patience: int | None = None
    best_metric: Literal["loss", "bleu"] = "loss"  # the dev metric that picks model.safetensors
    # what patience counts validations without improving: "best_metric" (the metric that
    # picks the best weights), or "loss_or_bleu" (either: the run stops once neither dev loss,
    # fairseq's patience metric, nor dev BLEU has improved in `patience` validations)
    patience_on: Literal["best_metric", "loss_or_bleu"] = "best_metric"
    valid_bleu: bool = True  # BLEU of greedy decoding of the dev set at each validation
    threads: int | None = None  # CPU threads (null: PyTorch's default)
    # torch.compile the model's training forward (dynamic shapes; validation and decoding stay
    # eager): for a small model on a GPU, whose update the host's work paces rather than the
    # GPU's. Slower on a CPU. The same recipe, but not the same run: compiled dropout draws
    # from another random stream, and fused kernels round differently
    compile: bool = False
    disagreement: DisagreementConfig = field(default_factory=DisagreementConfig)
    # start from a trained run's weights (a run directory: its model.safetensors; or one
    # .safetensors file in a run) with a fresh optimizer and schedule: a fine-tune, e.g. on
    # another domain's data, encoded with that run's vocabulary (data.vocab_from)
    init_from: str | None = None

    def __post_init__(self) -> None:
        positive(self, "train", "max_tokens", "update_freq", "warmup", "branch_warmup")
        positive(self, "train", "log_every", "valid_every", "keep_checkpoints")
        if self.freeze_branch_weights < 0:
            raise ConfigError(
                f"train.freeze_branch_weights={self.freeze_branch_weights} must be >= 0"
            )
        probability(self, "train", "label_smoothing", "freeze_branch_fraction")
        if self.warmup_fraction is not None:
            if not 0.0 < self.warmup_fraction < 1.0:
                raise ConfigError(
                    f"train.warmup_fraction={self.warmup_fraction!r} must be in (0, 1), or null"
                )
            if self.max_steps is not None or self.max_time is None:
                raise ConfigError(
                    "train.warmup_fraction sets the warm-up of a run bounded by train.max_time "
                    "alone: set train.max_steps to null and train.max_time"
                )
        positive(self, "train", "max_nonfinite")
        if self.save_every is not None:
            positive(self, "train", "save_every")
        if self.precision == "fp16" and self.device == "cpu":
            raise ConfigError("train.precision='fp16' needs a GPU: use 'bf16' on the CPU")
        if self.max_steps is None and self.max_epochs is None and self.max_time is None:
            raise ConfigError("train: set at least one of max_steps, max_epochs, max_time")
        # ranges: a negative clip norm ascends the gradient, a negative scale diverges, and a
        # zero budget "trains" nothing and reports success
        if isinstance(self.seed, bool) or not 0 <= self.seed < 2**31:
            raise ConfigError(f"train.seed={self.seed!r} must be an integer in [0, 2^31)")
        greater(self, "train", 0, "lr_scale", "adam_eps")
        greater(self, "train", 0, "clip_norm", "max_time", "peak_lr", optional=True)
        for name in ("max_steps", "max_epochs", "patience", "threads"):
            if getattr(self, name) is not None:
                positive(self, "train", name)
        for i, beta in enumerate(self.adam_betas):
            if not 0.0 <= beta < 1.0:
                raise ConfigError(f"train.adam_betas[{i}]={beta!r} must be in [0, 1)")


# The search's bounds: a beam past 1,024 hypotheses a sentence asks memory by the gigabyte for
# nothing a translation gains; |α| past 10 makes the penalty of a long output overflow (or
# vanish, a division by zero) in float arithmetic, where 10 already decides by length alone.
MAX_BEAM = 1024
MAX_LENGTH_PENALTY = 10.0
# output length limits: a·|source| + b; beyond these an output is longer than any model's
# positions anyway, and a server's bound on a request's work would overflow
MAX_LEN_A = 64.0
MAX_LEN_B = 65_536


@dataclass(frozen=True)
class DecodeConfig:
    """Search settings (Vaswani et al.: beam 4, length penalty α = 0.6 in the form of Wu et
    al., 2016). ``length_penalty_form``: "gnmt", ((5 + |y|) / 6)^α, or "fairseq", |y|^α
    (fairseq's ``--lenpen``, 1 by default: scores are log-probabilities per token)."""

    beam: int = 4  # beam size (1: greedy)
    nbest: int = 1  # hypotheses a sentence returned
    length_penalty: float = 0.6  # α of the length penalty that ranks finished hypotheses
    # gnmt: ((5 + |y|) / 6)^α; fairseq: |y|^α
    length_penalty_form: Literal["gnmt", "fairseq"] = "gnmt"
    max_len_a: float = 1.5  # maximum output length a·source_length + b
    max_len_b: int = 10  # b of the longest output a · source length + b
    batch_tokens: int = 4096  # padded source tokens a decoding batch

    def __post_init__(self) -> None:
        positive(self, "decode", "beam", "nbest", "batch_tokens")
        if self.beam > MAX_BEAM:
            raise ConfigError(f"decode.beam={self.beam}: allowed 1 to {MAX_BEAM}")
        if self.nbest > self.beam:
            raise ConfigError(f"decode.nbest={self.nbest} exceeds decode.beam={self.beam}")
        if not (math.isfinite(self.max_len_a) and 0 <= self.max_len_a <= MAX_LEN_A):
            raise ConfigError(f"decode.max_len_a={self.max_len_a!r}: allowed 0 to {MAX_LEN_A:g}")
        if not 0 <= self.max_len_b <= MAX_LEN_B:
            raise ConfigError(f"decode.max_len_b={self.max_len_b!r}: allowed 0 to {MAX_LEN_B:,}")
        if not -MAX_LENGTH_PENALTY <= self.length_penalty <= MAX_LENGTH_PENALTY:  # nan too
            raise ConfigError(
                f"decode.length_penalty={self.length_penalty!r}: allowed "
                f"{-MAX_LENGTH_PENALTY:g} to {MAX_LENGTH_PENALTY:g}"
            )


def init_run(init_from: str) -> str:
    """The run directory ``train.init_from`` names: itself, or the folder of a weights file
    (``RUN/average.safetensors``, ``RUN/checkpoints/step_….safetensors``)."""
    path = Path(init_from)
    if path.suffix != ".safetensors":
        return init_from
    folder = path.parent
    return str(folder.parent if folder.name == "checkpoints" else folder)


@dataclass(frozen=True)
class RunConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    prune: PruneRecord | None = None  # how a pruned model was made (`wtnmt prune`)

    def __post_init__(self) -> None:
        if self.train.init_from is not None and self.data.vocab_from is None:
            # a fine-tune reads the ids of the vocabulary its weights were trained on
            run = init_run(self.train.init_from)
            object.__setattr__(self, "data", replace(self.data, vocab_from=run))
        # a sentence of max_tokens_per_side pieces + BOS/EOS must have positions
        if self.model.max_positions < self.data.max_tokens_per_side + 1:
            raise ConfigError(
                f"model.max_positions={self.model.max_positions} is less than "
                f"data.max_tokens_per_side={self.data.max_tokens_per_side} + 1 (the sentence "
                f"and its BOS/EOS): raise the one or lower the other"
            )
