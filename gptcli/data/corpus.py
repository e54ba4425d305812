"""Corpora on disk: text files -> token shards (train.bin / val.bin), and reading them back.

A tokenized directory holds `train.bin` and `val.bin` (flat uint16 or uint32 token ids),
`tokenizer.json`, and `meta.json` (counts, tokenizer, and the sha256 of the source text, so
a second run over the same corpus is recognised). Text is streamed in chunks that end at
safe split points, so encoding a chunk at a time gives exactly the ids of encoding it whole
and a large file is never held in memory twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from gptcli import files
from gptcli.data.inputs import check_input, try_read_json, what_is
from gptcli.data.sources import Reader
from gptcli.data.tokenizer import (
    TOKENIZER_FILE,
    CharTokenizer,
    Tokenizer,
    build_tokenizer,
    load_tokenizer,
    parse_spec,
)
from gptcli.errors import UsageError
from gptcli.messages import command_line, printable
from gptcli.paths import cache_dir

META_FILE = "meta.json"
PUBLISHING = ".publishing"  # present while a tokenize moves its files into place
OUTPUTS = ("train.bin", "val.bin", "tokenizer.json", META_FILE)  # what tokenize writes
FORMAT = "gptcli-tokens"
VERSION = 2  # 2: a corpus that is one long last document still gets a val split
CHUNK_CHARS = 1 << 18  # characters handed to the encoder per chunk

Progress = Callable[[int, int], None]  # (bytes done, bytes total)


@dataclass
class CorpusScan:
    """What one streaming pass learned about the source files."""

    files: list[Path]
    bytes: int = 0
    documents: int = 0
    chars: int = 0
    sha256: str = ""


@dataclass
class TokenizeReport:
    """Counts of a tokenized corpus, as written to meta.json."""

    tokenizer: str
    request: str  # what was asked for: a spec, or name@hash of a given tokenizer
    vocab_size: int
    dtype: str
    val_fraction: float
    source_sha256: str
    files: list[str]
    documents: int
    bytes: int
    chars: int
    train_tokens: int
    val_tokens: int
    seconds: float = 0.0
    reused: bool = False

    @property
    def tokens(self) -> int:
        return self.train_tokens + self.val_tokens

    @property
    def chars_per_token(self) -> float:
        return self.chars / max(1, self.tokens)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / max(self.seconds, 1e-9)


# --- finding and checking the source text -------------------------------------------------


def is_tokenized_dir(path: Path) -> bool:
    meta = path / META_FILE
    if not meta.is_file():
        return False
    data = try_read_json(meta)
    return isinstance(data, dict) and data.get("format") == FORMAT


GGUF = ".gguf"  # a model file (gptcli export, llama.cpp), never text: skipped in a directory


def _written_by_gptcli(path: Path) -> bool:
    """A directory of weights gptcli wrote, which a corpus walk skips: a checkpoint (its
    checkpoint.json names gptcli's format), a run (its config and metrics, or a checkpoint
    in last/ or best/), or an export to Hugging Face's format (config.json beside weights)
    or PEFT's (--adapters-only)."""

    def checkpoint(d: Path) -> bool:
        meta = try_read_json(d / "checkpoint.json") if (d / "checkpoint.json").is_file() else None
        return isinstance(meta, dict) and meta.get("format") == "gptcli-checkpoint"  # store.checkpoint.FORMAT

    if checkpoint(path) or checkpoint(path / "last") or checkpoint(path / "best"):
        return True
    if (path / "config.yaml").is_file() and (path / "metrics.jsonl").is_file():
        return True
    weights = ("model.safetensors", "pytorch_model.bin")
    if (path / "config.json").is_file() and any((path / w).is_file() for w in weights):
        return True
    return (path / "adapter_config.json").is_file() and (path / "adapter_model.safetensors").is_file()


def collect_files(paths: Sequence[str | os.PathLike], exclude: Path | None = None) -> list[Path]:
    """Text files named by paths; a directory contributes its files recursively, sorted,
    following linked folders (each once), skipping hidden entries and what gptcli writes:
    directories made by `gptcli tokenize`, training runs and exported models, .gguf files
    among them (`gptcli pretrain .` reads the text, not its own checkpoints)."""
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        check_input(p, "the corpus", directory=True)
        if p.is_file():
            files.append(p)
            continue
        if is_tokenized_dir(p):
            raise UsageError(
                f"{printable(str(p), 300)} holds tokens (made by gptcli tokenize), not text: pretrain "
                "on it alone, or give text"
            )
        found, seen = [], {p.resolve()}
        for root, dirs, names in os.walk(p, followlinks=True):  # (a linked folder of data is data)
            r, kept = Path(root), []
            for d in sorted(dirs):
                real = (r / d).resolve()
                skipped = d.startswith(".") or is_tokenized_dir(r / d) or _written_by_gptcli(r / d)
                if skipped or real in seen or (exclude is not None and real == exclude.resolve()):
                    continue
                seen.add(real)  # (a link back up the tree is walked once)
                kept.append(d)
            dirs[:] = kept
            found += [r / n for n in sorted(names) if not n.startswith(".") and not n.lower().endswith(GGUF)]
        for f in found:  # a device never ends, a pipe may never start: files only
            if (kind := what_is(f)) != "a file":
                raise UsageError(
                    f"{printable(str(f), 300)} in the corpus is {kind}, not a file of text; move it out of "
                    f"{printable(str(p), 300)}"
                )
        if not found:
            raise UsageError(f"{p}: directory holds no text files")
        files += found
    return _each_once(files)


def _each_once(files: list[Path]) -> list[Path]:
    """files with each file kept where it first comes: one named twice, reached through a
    link or by two paths (a directory and a folder inside it) is read once, as it is one
    text (twice, its lines would be both in the training split and in the validation one)."""
    kept, seen = [], set()
    for f in files:
        try:
            st = f.stat()
        except OSError:  # (said when it is read)
            kept.append(f)
            continue
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            kept.append(f)
    return kept


def _newline_terminated(pieces: Iterator[str]) -> Iterator[str]:
    """Separate documents with a newline where there is no end-of-text token to do it."""
    last = "\n"
    for piece in pieces:
        if piece:
            last = piece[-1]
            yield piece
    if last != "\n":
        yield "\n"


def _is_safe_split(text: str, i: int) -> bool:
    """Whether text can be cut after the newline at i: a lone newline between two
    non-space characters ends a pre-token in every tokenizer here (GPT-2's and rustbpe's
    patterns), so encoding the two halves gives exactly the ids of encoding the whole."""
    return 0 < i < len(text) - 1 and not text[i - 1].isspace() and not text[i + 1].isspace()


def _safe_split(text: str, start: int = 0) -> int:
    """Index just after the last safe newline at or after start; -1 if there is none."""
    i = len(text)
    while (i := text.rfind("\n", start, i)) >= 0:
        if _is_safe_split(text, i):
            return i + 1
    return -1


def _first_safe_split(text: str, start: int) -> int:
    """Index just after the first safe newline at or after start; -1 if there is none."""
    i = start
    while (i := text.find("\n", i)) >= 0:
        if _is_safe_split(text, i):
            return i + 1
        i += 1
    return -1


def iter_chunks(pieces: Iterator[str], chunk_chars: int = CHUNK_CHARS) -> Iterator[str]:
    """Regroup streamed text into chunks of about chunk_chars that end at safe split points."""
    buf = ""
    for piece in pieces:
        buf += piece
        while len(buf) >= chunk_chars:
            cut = _safe_split(buf, chunk_chars // 2)
            if cut < 0:
                if len(buf) < 64 * chunk_chars:
                    break  # keep reading until a safe point turns up
                cut = len(buf)  # a giant line: give up on exactness rather than memory
            yield buf[:cut]
            buf = buf[cut:]
    if buf:
        yield buf


def scan_corpus(
    files: list[Path], want_chars: bool = False, newline_sep: bool = False, reader: Reader = Reader()
) -> tuple[CorpusScan, set[str]]:
    """One streaming pass: validate UTF-8 (and JSONL), count bytes, documents and characters,
    hash the text, and (for a char tokenizer) collect the character set. newline_sep: count
    the text as encoded without an end-of-text token (documents end with a newline)."""
    scan = CorpusScan(files=files)
    digest = hashlib.sha256()
    charset: set[str] = set()

    def on_bytes(n: int) -> None:
        scan.bytes += n

    for path in files:
        for doc in reader.documents(path, on_bytes):
            scan.documents += 1
            for text in _newline_terminated(doc) if newline_sep else doc:
                digest.update(text.encode("utf-8"))
                scan.chars += len(text)
                if want_chars:
                    charset.update(text)
            digest.update(b"\0")  # document boundary
    if scan.chars == 0:
        names = ", ".join(str(f) for f in files[:3])
        raise UsageError(f"the corpus is empty ({names}); give it some text")
    scan.sha256 = digest.hexdigest()
    return scan, charset


# --- tokenizing ----------------------------------------------------------------------------


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def _existing_meta(out: Path) -> dict | None:
    meta = out / META_FILE
    if not meta.exists():
        return None
    d = try_read_json(meta)
    return d if isinstance(d, dict) and d.get("format") == FORMAT else None


_META_SCHEMA: dict[str, tuple[type, ...]] = {
    "version": (int,), "tokenizer": (str,), "request": (str,), "vocab_size": (int,), "dtype": (str,),
    "val_fraction": (float,), "source_sha256": (str,), "files": (list,), "documents": (int,),
    "bytes": (int,), "chars": (int,), "train_tokens": (int,), "val_tokens": (int,),
    "tokenizer_sha256": (str,),
}  # fmt: skip


def read_meta(path: Path) -> TokenizeReport:
    d = _existing_meta(path)
    if d is None:
        raise UsageError(f"{path} is not a directory made by `gptcli tokenize` (no valid {META_FILE})")
    from gptcli.data.inputs import check_types

    check_types(d, {"version": (int,)}, str(path / META_FILE))  # first: a newer format may differ
    if d.get("version", 0) > VERSION:
        raise UsageError(f"{path} was written by a newer gptcli (format {d['version']}); upgrade gptcli")
    check_types(d, _META_SCHEMA, str(path / META_FILE))
    if d.get("dtype") not in ("uint16", "uint32"):
        raise UsageError(f"{path / META_FILE}: 'dtype' must be uint16 or uint32; re-run gptcli tokenize")
    if not all(isinstance(f, str) for f in d.get("files", [])):
        raise UsageError(f"{path / META_FILE}: 'files' must be a list of paths; re-run gptcli tokenize")
    fields = {k: d[k] for k in TokenizeReport.__dataclass_fields__ if k in d}
    try:
        return TokenizeReport(**fields)
    except TypeError as e:
        raise UsageError(f"{path / META_FILE} is incomplete ({e}); re-run gptcli tokenize") from e


def _check_out_dir(out: Path, request: str, scan: CorpusScan, val_fraction: float, force: bool) -> bool:
    """True if out already holds exactly this tokenization; raise if it holds anything else."""
    if not out.exists():
        return False
    if not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a directory")
    files.clean_stale(out, OUTPUTS)  # what a killed tokenize left behind
    meta = _existing_meta(out)
    if meta is not None:
        same = (
            meta.get("source_sha256") == scan.sha256
            and meta.get("request") == request
            and meta.get("val_fraction") == val_fraction
            and meta.get("version") == VERSION
            and _shards_whole(out, meta)
            and _tokenizer_whole(out, meta)
        )
        if same:
            return True
        if not force:
            if meta.get("request") != request:  # (first: the text's scan depends on the tokenizer)
                what = f"with tokenizer {meta.get('request')}, not {request}"
            elif meta.get("source_sha256") != scan.sha256:
                what = "of other text"
            elif meta.get("val_fraction") != val_fraction:
                what = f"with --val-fraction {meta.get('val_fraction')}, not {val_fraction}"
            elif meta.get("version") != VERSION:
                what = f"in data format version {meta.get('version')}, not {VERSION}"
            elif not _shards_whole(out, meta):
                what = "whose token files are missing, cut short or changed since"
            else:
                what = f"whose {TOKENIZER_FILE} is missing or is not the one written with its tokens"
            raise UsageError(
                f"{out} already holds a different tokenization ({what}); "
                "choose another --out or pass --force to replace it"
            )
        return False
    # a tokenize that died while publishing its files left its marker: safe to redo
    unfinished = (out / PUBLISHING).is_file()
    if not unfinished and any(out.iterdir()) and not force:
        raise UsageError(f"{out} is not empty; choose another --out or pass --force to write into it")
    return False


def _shards_whole(out: Path, meta: dict) -> bool:
    """Whether train.bin and val.bin hold as many ids as meta.json says they do."""
    try:
        itemsize = np.dtype(meta["dtype"]).itemsize
        return all(
            (out / f"{split}.bin").is_file()
            and (out / f"{split}.bin").stat().st_size == meta[f"{split}_tokens"] * itemsize
            for split in ("train", "val")
        )
    except (KeyError, TypeError, ValueError):
        return False


def _tokenizer_whole(out: Path, meta: dict) -> bool:
    """Whether the tokenizer is there, and the one written with the tokens where meta.json
    holds its hash (directories written before it was kept: there at all)."""
    path = out / TOKENIZER_FILE
    if not files.is_regular_file(path):
        return False
    want = meta.get("tokenizer_sha256")
    try:
        return want is None or hashlib.sha256(path.read_bytes()).hexdigest() == want
    except OSError:
        return False


class _ShardWriter:
    """Appends token ids to train.bin, then (after the split point) to val.bin, under
    temporary names private to this process; publish() moves them into place."""

    def __init__(self, out: Path, dtype: np.dtype) -> None:
        self.out, self.dtype = out, dtype
        self.tmp = {s: files.temp_path(out / f"{s}.bin") for s in ("train", "val")}
        self.files = {}
        try:
            for s, p in self.tmp.items():
                self.files[s] = files.open_new(p)
        except BaseException:
            self.abort()
            raise
        self.counts = {"train": 0, "val": 0}
        self.attempted = 0  # bytes of ids handed to write, including one that failed

    def write(self, split: str, ids: Sequence[int] | np.ndarray) -> None:
        arr = np.asarray(ids, dtype=self.dtype)
        self.attempted += arr.nbytes  # counted first: a failed write needed it too
        self.files[split].write(arr.tobytes())
        self.counts[split] += len(arr)

    def finish(self) -> None:
        for f in self.files.values():
            f.flush()
            os.fsync(f.fileno())
            f.close()

    def abort(self) -> None:
        for f in self.files.values():
            f.close()
        for tmp in self.tmp.values():
            tmp.unlink(missing_ok=True)


SEEK_CHARS = 4 * CHUNK_CHARS  # how far past the split point to look for a line or document end


def _split_stream(
    files: list[Path],
    split_char: int,
    newline_sep: bool,
    on_bytes: Callable[[int], None] | None,
    total_chars: int,
    reader: Reader = Reader(),
) -> Iterator[tuple[str, str | None]]:
    """Yield (split, chunk) over the corpus, and (split, None) where a document ends.

    Text before split_char goes to train, the rest to val. The cut moves forward to the next
    line boundary (a safe split point) or document end, whichever comes first; a line
    longer than SEEK_CHARS is cut where it stands, and so is the corpus's last chunk (of
    total_chars in all) when it holds the split point and no line boundary after it (else a
    corpus that ends in one long line would leave val empty)."""
    seen = 0
    state = "train" if split_char > 0 else "val"  # train -> seeking -> val
    for path in files:
        for doc in reader.documents(path, on_bytes):
            for chunk in iter_chunks(_newline_terminated(doc) if newline_sep else doc):
                if state == "train" and seen + len(chunk) > split_char:
                    state = "seeking"
                if state == "seeking":
                    start = max(0, split_char - seen)
                    cut = _first_safe_split(chunk, start)
                    if cut < 0 and seen + len(chunk) >= total_chars:
                        cut = start
                    if cut < 0 and seen + len(chunk) - split_char > SEEK_CHARS:
                        cut = max(start, split_char + SEEK_CHARS - seen)
                    if cut >= 0:
                        if cut > 0:
                            yield "train", chunk[:cut]
                        state, chunk, seen = "val", chunk[cut:], seen + cut
                if chunk:
                    yield ("train" if state == "seeking" else state), chunk
                    seen += len(chunk)
            yield ("train" if state == "seeking" else state), None
            if state == "seeking":
                state = "val"  # the document that held the split point ended


def _encode_stream(
    tok: Tokenizer,
    items: Iterator[tuple[str, str | None]],
    writer: _ShardWriter,
    on_written: Callable[[], None] | None = None,
) -> None:
    """Encode chunks on all cores (the tokenizers release the GIL) while the next ones are
    read, and write the ids, and the end-of-text token at each document end, in order."""
    threads = os.cpu_count() or 1
    window: deque[tuple[str, Future | None]] = deque()

    def write_oldest() -> None:
        split, future = window.popleft()
        if future is None:
            if tok.eot_id is not None:
                writer.write(split, [tok.eot_id])
        else:
            writer.write(split, future.result())

    with ThreadPoolExecutor(threads) as pool:
        for split, chunk in items:
            window.append((split, None if chunk is None else pool.submit(tok.encode_array, chunk)))
            while len(window) > 4 * threads:
                write_oldest()
                if on_written is not None:
                    on_written()
        while window:
            write_oldest()


def _describe_request(tokenizer: str | Tokenizer) -> tuple[str, str]:
    """(kind, request): what kind of tokenizer, and a key that identifies what was asked for."""
    if isinstance(tokenizer, str):
        return parse_spec(tokenizer)[0], tokenizer.strip().lower()
    blob = json.dumps(tokenizer.to_dict(), sort_keys=True).encode()
    return "given", f"{tokenizer.name}@{hashlib.sha256(blob).hexdigest()[:16]}"


def _scan_for(
    files: list[Path], tokenizer: str | Tokenizer, kind: str, reader: Reader
) -> tuple[CorpusScan, set[str]]:
    newline_sep = kind == "char" or (not isinstance(tokenizer, str) and tokenizer.eot_id is None)
    return scan_corpus(files, want_chars=kind == "char", newline_sep=newline_sep, reader=reader)


def _encode(
    sources: list[Path],
    out: Path,
    scan: CorpusScan,
    charset: set[str],
    tokenizer: str | Tokenizer,
    request: str,
    val_fraction: float,
    progress: Progress | None,
    t0: float,
    reader: Reader,
) -> TokenizeReport:
    """Build the tokenizer if needed, stream the corpus through it, write shards and meta."""
    kind = parse_spec(tokenizer)[0] if isinstance(tokenizer, str) else "given"
    if not isinstance(tokenizer, str):
        tok = tokenizer
    elif kind == "char":
        tok = CharTokenizer(sorted(charset))
    elif kind == "bpe":
        texts = (c for f in sources for doc in reader.documents(f) for c in iter_chunks(doc))
        tok = build_tokenizer(tokenizer, texts)
    else:
        tok = build_tokenizer(tokenizer)

    out.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tok.vocab_size)
    writer = _ShardWriter(out, dtype)
    done = 0

    def on_bytes(n: int) -> None:
        nonlocal done
        done += n

    try:
        split_char = scan.chars - int(scan.chars * val_fraction)
        items = _split_stream(sources, split_char, tok.eot_id is None, on_bytes, scan.chars, reader)
        _encode_stream(tok, items, writer, None if progress is None else lambda: progress(done, scan.bytes))
        writer.finish()
    except BaseException as e:
        writer.abort()
        if files.is_full(e):  # the whole size is not known until the end: what it had come to
            raise files.disk_full(out / "train.bin", writer.attempted, at_least=True, cause=e) from None
        raise
    if progress is not None:
        progress(scan.bytes, scan.bytes)

    report = TokenizeReport(
        tokenizer=tok.name,
        request=request,
        vocab_size=tok.vocab_size,
        dtype=dtype.name,
        val_fraction=val_fraction,
        source_sha256=scan.sha256,
        files=[str(f) for f in sources],
        documents=scan.documents,
        bytes=scan.bytes,
        chars=scan.chars,
        train_tokens=writer.counts["train"],
        val_tokens=writer.counts["val"],
        seconds=time.perf_counter() - t0,
    )
    meta = {"format": FORMAT, "version": VERSION, **asdict(report)}
    meta.pop("reused")
    _publish(out, writer, tok, meta)
    return report


def _publish(out: Path, writer: _ShardWriter, tok: Tokenizer, meta: dict) -> None:
    """Move the new files into place. meta.json goes first (removed) and last (written), so a
    crash in between leaves a directory that is plainly unfinished (and marked so: the same
    command then redoes it), never new shards under an old description; a concurrent
    writer of the same cache entry writes the same files."""
    tok_tmp, meta_tmp = files.temp_path(out / TOKENIZER_FILE), files.temp_path(out / META_FILE)
    tok_text = tok.dumps()
    meta = {**meta, "tokenizer_sha256": hashlib.sha256(tok_text.encode("utf-8")).hexdigest()}
    try:
        for tmp, text in ((tok_tmp, tok_text), (meta_tmp, json.dumps(meta, indent=2))):
            with files.open_new(tmp) as f:
                f.write(text.encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
    except BaseException as e:
        writer.abort()
        for tmp in (tok_tmp, meta_tmp):
            tmp.unlink(missing_ok=True)
        if files.is_full(e):
            raise files.disk_full(out / META_FILE, None, cause=e) from None
        raise
    files.write_file(out / PUBLISHING, str(os.getpid()))
    (out / META_FILE).unlink(missing_ok=True)
    for split in ("train", "val"):
        os.replace(writer.tmp[split], out / f"{split}.bin")
    os.replace(tok_tmp, out / TOKENIZER_FILE)
    os.replace(meta_tmp, out / META_FILE)
    files.fsync_dir(out)  # the renames reach the disk before the marker goes
    (out / PUBLISHING).unlink(missing_ok=True)  # a concurrent writer of the same entry may have gone first


def _check_val_fraction(val_fraction: float) -> None:
    if not 0.0 <= val_fraction < 1.0:
        raise UsageError(f"--val-fraction must be in [0, 1), got {val_fraction}")


def tokenize_corpus(
    paths: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    tokenizer: str | Tokenizer = "char",
    val_fraction: float = 0.1,
    force: bool = False,
    progress: Progress | None = None,
    reader: Reader = Reader(),
) -> TokenizeReport:
    """Encode text files (or directories of them) into out/{train,val}.bin.

    tokenizer: a spec (char and bpe:N learn their vocabulary from this corpus) or a
    ready tokenizer. The last `val_fraction` of the corpus (by characters, cut at a line
    boundary) becomes the validation split. A document is a file, or a line of a .jsonl file
    ({"text": ...}), or a row of a Parquet file (reader.text_column), compressed or not
    (gptcli/sources.py); BPE tokenizers end each with <|endoftext|>, others with a newline.
    If out already holds this exact tokenization it is reused, not rewritten.
    """
    _check_val_fraction(val_fraction)
    out = Path(out)
    files = collect_files(paths, exclude=out)
    t0 = time.perf_counter()
    kind, request = _describe_request(tokenizer)
    scan, charset = _scan_for(files, tokenizer, kind, reader)
    if _check_out_dir(out, request, scan, val_fraction, force):
        report = read_meta(out)
        report.reused = True
        return report
    return _encode(files, out, scan, charset, tokenizer, request, val_fraction, progress, t0, reader)


def cached_corpus(
    paths: Sequence[str | os.PathLike],
    tokenizer: str | Tokenizer = "char",
    val_fraction: float = 0.1,
    progress: Progress | None = None,
    reader: Reader = Reader(),
) -> tuple[Path, TokenizeReport]:
    """Tokenize raw text into the cache, keyed by its content hash and the tokenizer, so that
    training on the same text again starts at once. Returns (data dir, report)."""
    _check_val_fraction(val_fraction)
    files = collect_files(paths)
    t0 = time.perf_counter()
    kind, request = _describe_request(tokenizer)
    scan, charset = _scan_for(files, tokenizer, kind, reader)
    slug = "".join(c if c.isalnum() else "-" for c in request)
    out = cache_dir() / "tokens" / f"{scan.sha256[:20]}-{slug}-v{val_fraction:g}"
    if _check_out_dir(out, request, scan, val_fraction, force=True):
        report = read_meta(out)
        report.reused = True
        return out, report
    return out, _encode(files, out, scan, charset, tokenizer, request, val_fraction, progress, t0, reader)


def _again(path: Path) -> str:
    """The command that writes a damaged tokenized directory anew (--force: its meta.json
    would otherwise have it taken for the same tokenization, or refused as another)."""
    return command_line("tokenize", "CORPUS", "--out", path, "--force")


def load_split(path: str | os.PathLike, split: str) -> np.ndarray:
    """Memory-map the token ids of one split of a tokenized directory."""
    path = Path(path)
    report = read_meta(path)
    file = path / f"{split}.bin"
    if not file.is_file():
        raise UsageError(f"{file} is missing; tokenize the corpus again ({_again(path)})")
    dtype = np.dtype(report.dtype)
    size = file.stat().st_size
    if size % dtype.itemsize:
        raise UsageError(
            f"{file} is {size} bytes, not a whole number of {dtype.name} ids; tokenize the corpus again "
            f"({_again(path)})"
        )
    expected = getattr(report, f"{split}_tokens")
    if size != expected * dtype.itemsize:
        raise UsageError(
            f"{file} holds {size // dtype.itemsize:,} ids where {path / META_FILE} says {expected:,}: "
            f"it was cut short or changed since; tokenize the corpus again ({_again(path)})"
        )
    if size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(file, dtype=dtype, mode="r")


def load_data_tokenizer(path: str | os.PathLike) -> Tokenizer:
    return load_tokenizer(Path(path) / TOKENIZER_FILE)
