"""A run directory: what `wtnmt train` writes and `translate`, `evaluate` and `serve` read.

    config.yaml        the resolved config        spm.model          the vocabulary (or
                                                  spm.src.model, spm.tgt.model: one a side)
    checkpoints/       step_*.safetensors + step_*.state.pt (the last K, and the best)
    metrics.jsonl      one JSON object per logged step and per validation
    train.log          the log lines             model.safetensors   the weights to use
    machines.jsonl     the machine each start or resume of training ran on
    .lock              held by the process that writes the run

Training and decoding share this one way in. A new run is refused where a run already is; a
resume is checked against what the run's last checkpoint recorded (model config, data
options, vocabulary hash) before anything in the directory changes; a second process writing
the same run is refused; loading for decoding answers a missing, damaged or mismatched file
with one line.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import yaml

from wtnmt.config import ConfigError, RunConfig, config_from_dict, config_to_dict, load_config
from wtnmt.data.corpora import sha256_of
from wtnmt.data.io import DataError
from wtnmt.data.vocab import ALL_VOCABULARY_FILES, Vocabularies, vocabulary_files
from wtnmt.errors import CheckpointError, TrainingError
from wtnmt.rundir.checkpoints import latest_checkpoint, list_checkpoints
from wtnmt.rundir.files import atomic_write, load_weights, recorded_vocabulary
from wtnmt.safe_files import file_in_the_way, locked_by_another

# where the data lies, not what it is: these may change between a run and its resume
RELOCATABLE = {("data", "prepared_dir"), ("data", "corpus_dir")}
# the first line of every config.yaml a run writes: what tells a run's files from a user's
MARK = b"# written by wtnmt train: the resolved config of this run\n"


def with_defaults(values: dict[str, Any]) -> dict[str, Any]:
    """A recorded config with the keys added to wtnmt since it was written, at their defaults
    (what the run did, since a key is added with the behaviour it had); as recorded if it no
    longer validates."""
    try:
        return config_to_dict(config_from_dict(values))
    except (ConfigError, TypeError):
        return values


def config_differences(trained: dict[str, Any], asked: dict[str, Any]) -> list[str]:
    """``section.key old → new`` for every model and data key that differs (a key the run
    predates counts as its default)."""
    trained = with_defaults(trained)
    found = []
    for section in ("model", "data"):
        old, new = trained.get(section, {}), asked.get(section, {})
        for key in sorted(set(old) | set(new)):
            if (section, key) not in RELOCATABLE and old.get(key) != new.get(key):
                found.append(f"{section}.{key} {old.get(key)!r} → {new.get(key)!r}")
    return found


class RunDirectory:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.config_path = self.path / "config.yaml"
        self.weights_path = self.path / "model.safetensors"
        self.checkpoints = self.path / "checkpoints"
        self._lock_fd: int | None = None

    # ------------------------------------------------------------------------ writing a run
    def lock(self) -> None:
        """Make sure no other process writes this run (a POSIX lock on ``.lock``, held until
        ``unlock`` or the end of this process)."""
        blocked = file_in_the_way(self.path)
        if blocked == self.path:
            raise TrainingError(f"{self.path}: is a file; --out names the run directory")
        if blocked is not None:
            raise TrainingError(f"--out {self.path}: {blocked} is a file, not a directory")
        self.check_not_in_prepared_data()
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            owner = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise TrainingError(
                f"{self.path}: another process (pid {owner}) is writing this run; wait for it "
                f"to end, or give another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd
        # the only writer now: the temporary files a killed writer left (atomic_write's
        # names for the run's own files, nothing else in a directory the user may share)
        names = [
            f".{name}.*.tmp"
            for name in (self.config_path.name, *ALL_VOCABULARY_FILES, self.weights_path.name)
        ]
        debris = [p for name in names for p in self.path.glob(name)]
        debris += self.checkpoints.glob(".step_*.tmp")
        for path in debris:
            path.unlink(missing_ok=True)

    def busy(self) -> bool:
        """Whether another process holds the lock (is writing this run now). Reads only."""
        if self._lock_fd is not None:
            return False
        return locked_by_another(self.path / ".lock")

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the lock
            self._lock_fd = None

    def check_not_in_prepared_data(self) -> None:
        """A run never lives in a prepared-data directory (or below one): a rebuild of that
        directory replaces what it wrote there, and the run's files must not be in its way."""
        from wtnmt.data.prepared_dir import made_by_prepare

        path = self.path.resolve()
        for directory in (path, *path.parents):
            if made_by_prepare(directory):
                raise TrainingError(
                    f"--out {self.path}: is inside the prepared-data directory {directory}; "
                    f"give the run a directory of its own, outside it"
                )

    def check_new(self, config: RunConfig | None = None) -> None:
        """A new run may go into a new or empty directory, or one where a run of ours with
        the same model and data died before its first checkpoint; never over run files wtnmt
        did not write, never where a model is (a finished run whose checkpoints were deleted,
        an averaged model), never into another run's folder (other settings, or a prune's
        fine-tune: its curve and record would be taken for this run's)."""
        if list_checkpoints(self.checkpoints):
            raise TrainingError(
                f"{self.path} already holds a run: add --resume to continue it, or choose "
                f"another --out"
            )
        if (self.path / "prune.json").is_file():
            raise TrainingError(
                f"{self.path}: holds a `wtnmt prune` run (prune.json): a new run here would "
                f"train its shape from random weights under its record; finish its fine-tune "
                f"with `wtnmt train {self.config_path} --out {self.path} --resume`, or choose "
                f"another --out"
            )
        ours = self.config_path.is_file() and self.config_path.read_bytes().startswith(MARK)
        if ours and self.weights_path.exists():
            raise TrainingError(
                f"{self.path} already holds a model ({self.weights_path.name}); a new run would "
                f"overwrite it: choose another --out"
            )
        if ours and config is not None:
            trained = yaml.safe_load(self.config_path.read_text(encoding="utf-8")) or {}
            differences = config_differences(trained, config_to_dict(config))
            if differences:
                raise TrainingError(
                    f"{self.path}: holds the files of another run (its config.yaml: "
                    f"{'; '.join(differences[:3])}{'; …' if len(differences) > 3 else ''}); "
                    f"choose another --out"
                )
        vocabularies = [self.path / name for name in ALL_VOCABULARY_FILES]
        for path in (self.config_path, *vocabularies, self.weights_path):
            if path.exists() and not ours:
                raise TrainingError(
                    f"{path}: wtnmt did not write this file, and a new run would overwrite it; "
                    f"give --out a directory of its own"
                )
        if self.weights_path.exists():
            raise TrainingError(
                f"{self.path} already holds a model ({self.weights_path.name}); a new run would "
                f"overwrite it: choose another --out"
            )

    def resume_point(self, config: RunConfig, warn=print) -> tuple[Path, dict[str, Any]]:  # type: ignore[no-untyped-def]
        """The checkpoint to continue from, once ``config`` is known to ask for the run's own
        model and data. Reads only: nothing in the directory changes."""
        found = latest_checkpoint(self.checkpoints, warn=warn)
        if found is None:
            raise TrainingError(f"--resume: no complete checkpoint in {self.checkpoints}")
        path, state = found
        trained = state.get("config")
        if trained is None and self.config_path.is_file():  # a checkpoint from before records
            trained = yaml.safe_load(self.config_path.read_text(encoding="utf-8"))
        differences = config_differences(trained or {}, config_to_dict(config))
        if differences:
            raise TrainingError(
                f"--resume: {self.path} was trained with other settings: "
                f"{'; '.join(differences)}. A resumed run keeps its model and data; give "
                f"another --out to train a new one"
            )
        return path, state

    def reopen_curve(self, warn=print) -> None:  # type: ignore[no-untyped-def]
        """Before a resume appends to ``metrics.jsonl``: a curve kept compressed
        (``metrics.jsonl.gz``, ``wtnmt.stored``) is made plain again, so that the run's curve
        stays one file (appending beside the ``.gz`` split it, and readers saw half)."""
        from wtnmt import stored

        try:
            done = stored.reopen(self.path / "metrics.jsonl")
        except OSError as e:
            raise TrainingError(f"--resume: {e.filename}: {e.strerror}") from None
        if done is not None:
            warn(f"{self.path}: {done}")

    def finished_again(self) -> None:
        """Training goes on: a ``finished.json`` from an earlier end no longer says how the
        run ended (the grid's runner writes it anew when this training ends)."""
        (self.path / "finished.json").unlink(missing_ok=True)

    def check_vocabulary(self, state: dict[str, Any], data_dir: Path, joint: bool) -> None:
        """Refuse to resume on a vocabulary other than the one the run was trained with."""
        from wtnmt.data.vocab import vocabularies_sha256, vocabulary_files

        names = vocabulary_files(joint)
        if not all((data_dir / name).is_file() for name in names):
            return
        # the vocabulary's content, not the file's bytes: a rebuild of the same data records
        # other paths in the model file (checkpoints before vocabulary_sha256 kept the bytes')
        if all((self.path / name).is_file() for name in names):  # the run's own copies
            changed = vocabularies_sha256(self.path, joint) != vocabularies_sha256(data_dir, joint)
        elif state.get("vocabulary_sha256") is not None:
            changed = state["vocabulary_sha256"] != vocabularies_sha256(data_dir, joint)
        else:
            recorded = state.get("vocab_sha256")
            changed = recorded is not None and sha256_of(data_dir / names[0]) != recorded
        if changed:
            raise TrainingError(
                f"--resume: the vocabulary in {data_dir} is not the one {self.path} was "
                f"trained with (its training data changed since): the weights would read "
                f"other ids; give another --out to train a new run"
            )

    def write_setup(self, config: RunConfig, data_dir: Path) -> None:
        """config.yaml and the vocabularies, each written atomically, with their checksums."""
        from wtnmt.data.vocab import vocabulary_files

        text = yaml.safe_dump(config_to_dict(config), sort_keys=False)
        atomic_write(self.config_path, MARK + text.encode())
        for name in vocabulary_files(config.data.joint_vocab):
            if (data_dir / name).is_file():
                write_vocabulary(self.path / name, (data_dir / name).read_bytes())


def write_vocabulary(path: Path, data: bytes) -> None:
    """A run's vocabulary (spm.model, …), and its checksum beside it (NAME.sha256, checked
    when the run is loaded)."""
    import hashlib

    atomic_write(path, data)
    digest = hashlib.sha256(data).hexdigest()
    atomic_write(path.with_name(f"{path.name}.sha256"), f"{digest}  {path.name}\n".encode())


def copy_vocabularies(run: Path, out: Path) -> None:
    """The vocabularies of ``run`` (whichever it has), with their checksums, into ``out``."""
    for name in ALL_VOCABULARY_FILES:
        if (run / name).is_file():
            write_vocabulary(out / name, (run / name).read_bytes())


def check_vocabulary_file(path: Path) -> None:
    """A CheckpointError if a run's vocabulary differs from the checksum written with it
    (runs from before the checksum load unchecked)."""
    kept = path.with_name(f"{path.name}.sha256")
    if not kept.is_file():
        return
    recorded = kept.read_text(encoding="utf-8", errors="replace").split()
    if not recorded or sha256_of(path) != recorded[0]:
        raise CheckpointError(
            f"{path}: the vocabulary is damaged (its sha256 differs from the one in "
            f"{kept.name}, written with it)"
        )


# ---------------------------------------------------------------------------- reading a run
def missing_weights(run: Path, weights: str) -> str:
    """Why ``run`` cannot be decoded with ``weights``, and what can be: a run stopped before
    its first validation has checkpoints but no model.safetensors yet."""
    newest = sorted((run / "checkpoints").glob("step_*.safetensors"))
    if weights == "model.safetensors" and newest:
        last = newest[-1].relative_to(run)
        return (
            f"{run}: no model.safetensors yet (it is written at the first validation, "
            f"train.valid_every); decode its newest checkpoint with --weights {last}, or train "
            f"on with --resume"
        )
    return f"{run}: no {weights} there"


def load_run(path: str | Path, *, weights: str = "model.safetensors"):  # type: ignore[no-untyped-def]
    """(config, Vocabularies, model with the weights) of a run, for decoding; every problem
    with its files is a CheckpointError naming the file."""
    from wtnmt.model import build_model

    run = Path(path)
    if not run.is_dir():
        raise CheckpointError(f"{run}: no such run directory")
    if not (run / "config.yaml").is_file():
        raise CheckpointError(f"{run}: no config.yaml there; is it a wtnmt run directory?")
    try:
        config = load_config(run / "config.yaml")
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    names = vocabulary_files(config.data.joint_vocab)
    for name in names:
        if not (run / name).is_file():
            raise CheckpointError(f"{run}: no {name} there; is it a wtnmt run directory?")
    if not (run / weights).is_file():
        raise CheckpointError(missing_weights(run, weights))
    for name in names:
        check_vocabulary_file(run / name)
    try:
        vocabularies = Vocabularies.load(run, config.data.joint_vocab)
    except DataError as e:
        raise CheckpointError(str(e)) from None
    model = build_model(
        config.model,
        vocab_size=len(vocabularies.target),
        source_vocab_size=vocabularies.source_size,
    )
    load_weights(model, run / weights)
    check_bound(run, weights, config.data.joint_vocab)
    return config, vocabularies, model


def check_bound(run: Path, weights: str, joint: bool) -> None:
    """A CheckpointError where ``run``'s vocabularies are not the ones its weights were
    trained with (the hash the weights' header records; weights from before it load
    unchecked): two SentencePiece models swapped with their checksums, or replaced."""
    from wtnmt.data.vocab import vocabularies_sha256

    recorded = recorded_vocabulary(run / weights)
    if recorded is not None and vocabularies_sha256(run, joint) != recorded:
        files = " and ".join(vocabulary_files(joint))
        raise CheckpointError(
            f"{run}: {files} are not the vocabularies {weights} was trained with (their hash "
            f"differs from the one its header records): were they swapped or replaced? Put "
            f"back the run's own"
        )


__all__ = ["RunDirectory", "config_differences", "load_run"]
