"""Fast decoding on the CPU: each new token through the whole model in one C call.

Decoding reads every weight once per token and does little else, so its speed is set by
how fast the weights stream from memory, and by what runs between the products. decode.c
does a whole step (every block, the unembedding, the KV-cache writes) for every row at
once, reading each weight once for all rows, in the dtype it is stored in (fp32, bf16,
or int8 with a scale per output row, gptcli/infer/quantize.py): no Python, no framework
and no kernel launches between the operations. bf16 weights (on CPUs with AVX512-BF16 or
AVX2) and int8 weights (AVX512-VNNI or AVX2) are read from a copy packed in the order the products
take them (built when the model first decodes this way: as much memory again as its weights).

It is built with the machine's own C compiler for its own instruction set (`cc -O3
-march=native -fopenmp`) the first time it is needed, by a process of its own
(kernel_build.py) that a background thread waits for: decoding goes on with the model's own
code meanwhile, so a short generation never waits for it, and a command that ends first
leaves the build running for the next one. It is kept in GPTCLI_KERNELS_DIR (default: the
gptcli cache's kernels/), under a name that hashes the source, the compiler and the CPU's
features: a change to any of them builds anew; deleting the directory is always safe.
Without a compiler, decoding quietly stays on the model's own code.

The C step takes over one-token steps on a growing (not static) KV cache, and a prompt of
one row (Decoder.prefill: any length where the weights have a packed copy, else up to
STORED_PREFILL tokens), and runs of several steps a call with no Python between them: one
sequence decoded greedily or drawn from its logits (run_steps: each step's id chosen and
fed to the next in C), and beam search (beam_steps: each step's continuations ranked and
the beams taken on in C);
training and anything with a probe keep the model's own code. The weights are
checked once a generation (a cache, until it is reset): a model moved, cast, reloaded or
changed in place is read anew from the next generation on. Changing weights in place in
the middle of a generation is not supported: the step would read the ones it takes where
they are anew, and its copies (the packed weights, the LayerNorms) as they were.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import operator
import os
import platform
import shlex
import shutil
import struct
import subprocess
import sys
import threading
import types
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from gptcli import files
from gptcli.cpuinfo import cpu_bf16_feature, cpu_flags
from gptcli.infer import kernel_build
from gptcli.infer.quantize import Int8Linear as _Quantized
from gptcli.model import GPT, KVCache

SOURCE = Path(__file__).with_name("decode.c")
F32, BF16, I8 = 0, 1, 2
PACK = 16  # decode.c's packed copies have their rows rounded up to a multiple of this
_VERSION = operator.attrgetter("_version")
_DTYPES = {torch.float32: F32, torch.bfloat16: BF16, torch.int8: I8}
PREFILL_ROWS = 64  # a prompt's tokens per call of the C prefill (see Decoder.prefill)
# the longest prompt the C prefill encodes from weights read as stored (fp32; bf16 on a CPU
# with neither AVX512-BF16 nor AVX2): their products take one row at a time, and torch's own
# are faster past it (GPT-2 124M, fp32, Zen 5: 128 tokens 155 ms against torch's 180, 300
# tokens 427 against 347)
STORED_PREFILL = 128


class _Mat(ctypes.Structure):
    _fields_ = [
        ("w", ctypes.c_void_p),
        ("scale", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("n", ctypes.c_int),
        ("k", ctypes.c_int),
        ("packed", ctypes.c_void_p),
    ]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("ln1_w", ctypes.c_void_p),
        ("ln1_b", ctypes.c_void_p),
        ("ln2_w", ctypes.c_void_p),
        ("ln2_b", ctypes.c_void_p),
        ("attn", _Mat),
        ("proj", _Mat),
        ("fc", _Mat),
        ("out", _Mat),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        ("n_layer", ctypes.c_int),
        ("n_head", ctypes.c_int),
        ("n_embd", ctypes.c_int),
        ("vocab", ctypes.c_int),
        ("block", ctypes.c_int),
        ("emb_dtype", ctypes.c_int),
        ("wte", ctypes.c_void_p),
        ("wpe", ctypes.c_void_p),
        ("lnf_w", ctypes.c_void_p),
        ("lnf_b", ctypes.c_void_p),
        ("head", _Mat),
        ("layers", ctypes.POINTER(_Layer)),
        ("cache_dtype", ctypes.c_int),
    ]


# --- building and loading the library -----------------------------------------------------------


def kernels_dir() -> Path:
    from gptcli.paths import cache_dir

    # absolute: ctypes searches the system's library path for a bare file name ("./x" is not one)
    return Path(os.environ.get("GPTCLI_KERNELS_DIR") or cache_dir() / "kernels").expanduser().absolute()


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


# -fno-trapping-math: no floating-point exception is ever looked at, and without it GCC
# keeps floorf scalar, so the GELU's and the softmax's e^x loops are not vectorized
FLAGS = ["-O3", "-march=native", "-fno-trapping-math", "-shared", "-fPIC", "-std=c11"]
THREADS = ["-fopenmp"]  # left out where the compiler has no OpenMP (Apple's clang): one thread

# decode.c's code paths, by the instruction sets the compiler may use (in place of
# -march=native) and the CPU features (/proc/cpuinfo's names) they need: the library as it
# is built for other CPUs, to test and time each path on one CPU that has them all
ISAS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "avx512-bf16-vnni": (
        ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mavx512vnni", "-mfma"],
        ("avx512f", "avx512_bf16", "avx512_vnni"),
    ),
    "avx512-vnni": (  # packed int8 without packed bf16 (Cascade Lake, Ice Lake)
        ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma"],
        ("avx512f", "avx512_vnni"),
    ),
    "avx512": (["-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma"], ("avx512f",)),
    "avx2": (["-mavx2", "-mfma"], ("avx2", "fma")),
    "plain": ([], ()),
}


def isa_flags(isa: str) -> list[str]:
    """FLAGS with ISAS[isa]'s instruction sets in place of -march=native."""
    return [*(f for f in FLAGS if not f.startswith("-march=")), *ISAS[isa][0]]


def cpu_has_isa(isa: str) -> bool:
    """Whether this CPU runs the library built with isa_flags(isa)."""
    flags, needs = ISAS[isa]
    if flags and platform.machine() not in ("x86_64", "AMD64"):
        return False
    return set(needs) <= set(_cpu_features().split())


def bf16_products() -> str | None:
    """The instruction set with which the kernel multiplies bf16 weights on a CPU without
    native bf16 (AVX2: widened to fp32 as they are read, from a packed copy), where the
    kernel is loaded or can be built (a C compiler that runs, no earlier build of it refused,
    a place to keep it); None elsewhere (a CPU with native bf16 has torch's own fast bf16
    products too; without the kernel, torch's bf16 products on AVX2 are slow)."""
    if cpu_bf16_feature() or _compiler() is None or not cpu_has_isa("avx2"):
        return None
    return "AVX2" if LIBRARY.usable() else None  # (a kernel known not to build: fp32, torch's fast products)


def _cpu_features() -> str:
    return " ".join(cpu_flags()) or platform.processor() or platform.machine()


def _cpu_identity() -> str:
    """What the library's name takes from the CPU it was built for (-march=native): Linux's
    feature flags; on macOS, which has no /proc/cpuinfo, sysctl's model and feature flags
    (a cache copied to another Mac must not load code its CPU lacks)."""
    flags = " ".join(cpu_flags())
    if flags or sys.platform != "darwin":
        return flags or _cpu_features()
    keys = ["machdep.cpu.brand_string", "machdep.cpu.features", "machdep.cpu.leaf7_features"]
    try:  # (Apple silicon has no feature keys: its model names it; sysctl says the rest are unknown)
        done = subprocess.run(
            ["sysctl", "-n", *keys], capture_output=True, text=True, check=False, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return _cpu_features()
    return " ".join(done.stdout.split()) or _cpu_features()


def library_path(compiler: str, flags: list[str] = FLAGS, source: bytes | None = None) -> Path:
    """Where the library for this source (SOURCE's text, unless given), compiler, flags and
    CPU lives."""
    version = subprocess.run(
        [*shlex.split(compiler), "--version"], capture_output=True, text=True, check=False
    )
    text = SOURCE.read_bytes() if source is None else source
    key = hashlib.sha256(
        "\0".join(
            [kernel_build.digest(text), compiler, version.stdout, " ".join(flags + THREADS), _cpu_identity()]
        ).encode()
    )
    return kernels_dir() / f"gptcli-decode-{key.hexdigest()[:16]}.so"


FUNCTIONS = {  # what decode.c offers, and what each returns
    "gptcli_decode_step": ctypes.c_int,
    "gptcli_decode_run": ctypes.c_int,
    "gptcli_beam_run": ctypes.c_int,
    "gptcli_prefill": ctypes.c_int,
    "gptcli_packs": ctypes.c_int,
    "gptcli_pack": None,
    "gptcli_argmax": None,
    "gptcli_draw": ctypes.c_int,
    "gptcli_sample": ctypes.c_int,
    "gptcli_logsumexp": None,
    "gptcli_top_rows": ctypes.c_int,
    "gptcli_best": ctypes.c_int,
}


def whole_library(path: Path) -> bool:
    """Whether an ELF library at path holds every byte its headers point to: the loader maps
    one cut short (a copied cache, a disk that lost its end) and the process dies of SIGBUS
    at its first call, which no exception catches. Other formats (Mach-O): True, the loader's
    own checks then."""
    try:
        with path.open("rb") as f:
            head = f.read(64)
            size = os.fstat(f.fileno()).st_size
            if head[:4] != b"\x7fELF":
                return True
            if len(head) < 52 or head[4] not in (1, 2) or head[5] not in (1, 2):
                return False
            wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
            if wide and len(head) < 64:
                return False
            if wide:
                phoff, shoff = struct.unpack_from(order + "QQ", head, 32)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 54)
            else:
                phoff, shoff = struct.unpack_from(order + "II", head, 28)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 42)
            if phoff + phentsize * phnum > size or shoff + shentsize * shnum > size:
                return False
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            for i in range(phnum):  # every segment's bytes in the file: p_offset + p_filesz
                if wide:
                    _, _, offset, _, _, filesz = struct.unpack_from(order + "IIQQQQ", table, i * phentsize)
                else:
                    _, offset, _, _, filesz = struct.unpack_from(order + "IIIII", table, i * phentsize)
                if offset + filesz > size:
                    return False
            return True
    except (OSError, struct.error):
        return False


class _Library:
    """The compiled decode.c, built once per machine in the background (flags: FLAGS, or
    isa_flags(...) for another CPU's code paths)."""

    def __init__(self, flags: list[str] = FLAGS) -> None:
        self.flags = flags
        self.lib: ctypes.CDLL | None = None
        self.failed: str | None = None
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def _plan(self) -> tuple[str, bytes, Path] | None:
        """(compiler, source text, library path) where the library may be loaded or built,
        else None with self.failed saying why (no compiler, one that does not run, a build
        of this source refused before, something else at the library's name)."""
        compiler = _compiler()
        if compiler is None:
            self.failed = "no C compiler (cc, gcc or clang)"
            return None
        try:  # CC may name a program that is not there, or be a command with flags
            text = SOURCE.read_bytes()  # (read once: what the build compiles is checked against it)
            path = library_path(compiler, self.flags, text)
        except (OSError, ValueError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else e
            self.failed = f"the C compiler {compiler!r} did not run ({why})"
            return None
        why = kernel_build.refused(path)  # this source, compiler and flags did not build before
        if why is not None:
            self.failed = _not_built(why, kernel_build.failure_record(path))
            return None
        if path.exists() and not path.is_file():
            self.failed = f"the CPU decoding kernel cannot be kept: {path} is in the way (not a file)"
            return None
        return compiler, text, path

    def usable(self) -> bool:
        """Whether the library is loaded, being built, or may be loaded or built here (what
        start checks first, without building anything: a command refused later starts
        nothing); where not, self.failed says why."""
        with self.lock:
            if self.lib is not None or self.thread is not None:
                return True
            if self.failed is not None:
                return False
            plan = self._plan()
            if plan is None:
                return False
            path = plan[2]
            if path.is_file():
                return True
            place = next((p for p in (path.parent, *path.parent.parents) if p.exists()), None)
            if place is not None and place.is_dir() and os.access(place, os.W_OK | os.X_OK):
                return True
            blocker = files.in_the_way(path)
            why = f"{blocker} is a file, not a directory" if blocker is not None else "not writable"
            self.failed = (
                f"the CPU decoding kernel cannot be kept in {path.parent} ({why}): "
                "set GPTCLI_KERNELS_DIR to a writable directory"
            )
            return False

    def start(self) -> bool:
        """Load the library, or start building it; True when it is being built (not cached)."""
        with self.lock:
            if self.lib is not None or self.failed is not None or self.thread is not None:
                return False
            plan = self._plan()
            if plan is None:
                return False
            compiler, text, path = plan
            if path.is_file():
                if whole_library(path) and self._load(path):
                    return False
                self.failed = None  # cut short or unloadable (copied in, or a disk that lost it): built anew
            try:  # where the build will write (a read-only disk, a file in the way: said now, once)
                path.parent.mkdir(parents=True, exist_ok=True)
                if not os.access(path.parent, os.W_OK | os.X_OK):
                    raise PermissionError("not writable")
            except OSError as e:
                blocker = files.in_the_way(path)  # (GPTCLI_CACHE_DIR=notes.txt)
                why = f"{blocker} is a file, not a directory" if blocker is not None else e.strerror or e
                self.failed = (
                    f"the CPU decoding kernel cannot be kept in {path.parent} ({why}): "
                    "set GPTCLI_KERNELS_DIR to a writable directory"
                )
                return False
            # without OpenMP (one thread), then for the compiler's default CPU where it
            # cannot target this one (-march=native is not known to every compiler)
            mine, portable = self.flags, [f for f in self.flags if not f.startswith("-march=")]
            attempts = [[*mine, *THREADS], mine, [*portable, *THREADS], portable]
            request = kernel_build.request(compiler, SOURCE, path, attempts, kernel_build.digest(text))
            # the build's own process starts here, not in the thread: a command that ends a
            # moment after this still leaves it running
            process = _start_build(request)
            self.thread = threading.Thread(target=self._build, args=(process, request, path), daemon=True)
            self.thread.start()
            return True

    def _build(self, process: subprocess.Popen | None, request: str, path: Path) -> None:
        try:
            if process is None:  # (no interpreter to start: built here)
                kernel_build.build_request(request)
            else:
                _, errors = process.communicate()
                if process.returncode:
                    ended = f"the build process ended with {process.returncode}"
                    raise OSError(kernel_build.why_not(errors, ended))
        except Exception as e:  # the model's own code decodes instead (the build recorded why)
            self.failed = _not_built(str(e))
            return
        self._load(path)

    def _load(self, path: Path) -> bool:
        try:
            lib = ctypes.CDLL(str(path))
            for name, restype in FUNCTIONS.items():
                getattr(lib, name).restype = restype
            self.lib = lib
            return True
        except (OSError, AttributeError) as e:  # (AttributeError: a library without one of FUNCTIONS)
            self.failed = f"the CPU decoding kernel did not load ({e})"
            return False

    def wait(self) -> ctypes.CDLL | None:
        """The library, once any build in progress has ended (tests, benchmarks)."""
        if self.thread is not None:
            self.thread.join()
        return self.lib


def _not_built(why: str, record: Path | None = None) -> str:
    """Why the kernel is not used, from a build's verdict (kernel_build.build: the compiler's
    error, or a library that did not load), with what to do where it was recorded."""
    if why.startswith(kernel_build.NOT_LOADED):  # (a disk mounted noexec)
        why = why.removeprefix(kernel_build.NOT_LOADED)
        said = f"the CPU decoding kernel was built but did not load ({why})"
        todo = "set GPTCLI_KERNELS_DIR to a directory on another disk, or delete {} to try again"
    else:
        said, todo = f"the CPU decoding kernel did not build ({why})", "delete {} to try again"
    return f"{said}; {todo.format(record)}" if record is not None else said


# the build process's program: this gptcli first on the path, ahead of the working
# directory's (where another checkout may sit)
_BUILD = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from gptcli.infer.kernel_build import main; sys.exit(main(sys.argv[2:]))"
)


def _start_build(request: str) -> subprocess.Popen | None:
    """gptcli/infer/kernel_build.py in a process of its own session, which outlives this one
    (and its Ctrl-C) if it must; None where no Python can be started (an embedded or frozen
    interpreter), and the build then runs in this process."""
    if not sys.executable or getattr(sys, "frozen", False):
        return None
    root = str(Path(__file__).resolve().parents[2])
    try:
        return subprocess.Popen(
            [sys.executable, "-c", _BUILD, root, request],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except OSError:
        return None


LIBRARY = _Library()


# --- a model's weights, as the C step reads them ---------------------------------------------------


def _f32(t: torch.Tensor | None, keep: list[torch.Tensor]) -> int | None:
    if t is None:
        return None
    t = t.detach().float().contiguous()
    keep.append(t)
    return t.data_ptr()


HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)  # (Linux only)
MADV_COLLAPSE = 25  # (Linux 6.1 on; mmap has no name for it before Python 3.13)
MERGE_AFTER = 32  # steps a Decoder takes before its weights' pages are merged (merge_pages)


def _fresh(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor (numel,) in memory of its own on Linux: an anonymous private
    mapping, 2 MB-aligned and freed with the tensor, so that its pages can be merged into
    huge ones (merge_pages) without touching anything else (the process's heap)."""
    nbytes = numel * dtype.itemsize
    if MADV_HUGEPAGE is None or nbytes < HUGE_PAGE:
        return torch.empty(numel, dtype=dtype)
    memory = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = ctypes.c_char.from_buffer(memory)
    start = -ctypes.addressof(view) % HUGE_PAGE  # (a multiple of the page size: the mapping's start is one)
    del view
    return torch.frombuffer(memory, dtype=dtype, count=numel, offset=start)


def merge_pages(tensors: list[torch.Tensor]) -> None:
    """Asks Linux to put the whole 2 MB stretches of these tensors' memory on huge pages: now
    (MADV_COLLAPSE, Linux 6.1 on: the kernel copies them while the process runs on, at the same
    addresses) and whenever its khugepaged gets to them (MADV_HUGEPAGE). A step streams every
    weight: with 4 KB pages a 124M model's 250 MB are 60,000 pages for the TLB to walk and for
    the hardware prefetchers, which stop at a page's end, to start anew in. Refused (an older
    kernel, THP "never"): the pages stay as they were. See Decoder.step for when."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for t in tensors:
        lo = -(-t.data_ptr() // HUGE_PAGE) * HUGE_PAGE
        hi = (t.data_ptr() + t.numel() * t.element_size()) // HUGE_PAGE * HUGE_PAGE
        if hi > lo and libc.madvise(lo, hi - lo, MADV_HUGEPAGE) == 0:
            libc.madvise(lo, hi - lo, MADV_COLLAPSE)  # (ctypes lets go of the GIL meanwhile)


def _packed_numel(lib: ctypes.CDLL, w: torch.Tensor) -> int | None:
    """How many elements the packed copy of weights w (n, k) takes on this CPU, or None where
    the C step reads them as they are."""
    n, k = w.shape
    if w.dtype not in _DTYPES or k % 2 or not lib.gptcli_packs(_DTYPES[w.dtype]):
        return None
    return -(-n // PACK) * PACK * k


class _Arena:
    """Memory for every packed copy of one Decoder: one mapping of its own (_fresh), handed
    out in order, 64-byte aligned, so that all of it but its last 2 MB can be put on huge
    pages (merge_pages), where a mapping per copy would leave each one's last part (GPT-2
    124M's 2.3 MB to 4.7 MB products: a quarter of their bytes) on 4 KB pages."""

    def __init__(self, nbytes: int) -> None:
        self.memory, self.used = _fresh(nbytes, torch.uint8), 0

    @staticmethod
    def room(numel: int, dtype: torch.dtype) -> int:
        return -(-numel * dtype.itemsize // 64) * 64

    def take(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        t = self.memory[self.used : self.used + numel * dtype.itemsize].view(dtype)
        self.used += self.room(numel, dtype)
        return t


def _packed(lib: ctypes.CDLL, w: torch.Tensor, arena: _Arena) -> int | None:
    """bf16 or int8 weights (n, k) in the order the C step's products read them on this CPU
    (decode.c, gptcli_pack), in room taken from arena, or None where it reads them as they are."""
    numel = _packed_numel(lib, w)
    if numel is None:
        return None
    n, k = w.shape
    packed = arena.take(numel, w.dtype)
    src, dst = ctypes.c_void_p(w.data_ptr()), ctypes.c_void_p(packed.data_ptr())
    lib.gptcli_pack(src, _DTYPES[w.dtype], n, k, dst, torch.get_num_threads())
    return packed.data_ptr()


def _mat(lib: ctypes.CDLL, linear: nn.Module, keep: list[torch.Tensor], arena: _Arena) -> _Mat:
    """A Linear (or quantize.Int8Linear) as the C step reads it."""
    w = linear.weight.detach()
    if not w.is_contiguous() or w.dtype not in _DTYPES:
        raise ValueError("weights the decoding kernel cannot read")
    keep.append(w)
    scale = getattr(linear, "scale", None)
    return _Mat(
        w.data_ptr(),
        _f32(scale, keep),
        _f32(linear.bias, keep),
        _DTYPES[w.dtype],
        w.size(0),
        w.size(1),
        _packed(lib, w, arena),
    )


class Decoder:
    """One model's weights, pointed to for the C step: the model's own tensors, fp32 copies
    of the small ones (LayerNorms and biases), and a copy of the bf16 weights (on CPUs with
    AVX512-BF16 or AVX2) or int8 weights (AVX512-VNNI or AVX2) packed for the products, in one arena:
    as much memory again as those weights."""

    def __init__(self, model: GPT, lib: ctypes.CDLL) -> None:
        t, c = model.transformer, model.config
        if t.wte.weight.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError("embeddings the decoding kernel cannot read")
        # what the step reads, held as detached tensors (their memory, not the parameters): a
        # model cast or moved while a generation runs replaces its parameters' .data, which
        # then frees the old memory only once the next generation's Decoder replaces this one
        keep: list[torch.Tensor] = [t.wte.weight.detach(), t.wpe.weight.detach()]
        linears = _products(model)
        sizes = [(_packed_numel(lib, m.weight), m.weight.dtype) for m in linears]
        self.arena = _Arena(sum(_Arena.room(n, d) for n, d in sizes if n is not None))
        keep.append(self.arena.memory)
        layers = (_Layer * c.n_layer)()
        for i, block in enumerate(t.h):
            layers[i] = _Layer(
                _f32(block.ln_1.weight, keep),
                _f32(block.ln_1.bias, keep),
                _f32(block.ln_2.weight, keep),
                _f32(block.ln_2.bias, keep),
                *(_mat(lib, m, keep, self.arena) for m in linears[4 * i : 4 * i + 4]),
            )
        self.model = _Model(
            c.n_layer,
            c.n_head,
            c.n_embd,
            c.vocab_size,
            c.block_size,
            _DTYPES[t.wte.weight.dtype],
            t.wte.weight.data_ptr(),
            t.wpe.weight.data_ptr(),
            _f32(t.ln_f.weight, keep),
            _f32(t.ln_f.bias, keep),
            _mat(lib, linears[-1], keep, self.arena),
            layers,
            BF16,
        )
        self.layers, self.keep, self.vocab = layers, keep, c.vocab_size
        self.packed = bool(self.model.head.packed)  # products from packed copies (prefills of any length)
        self.steps = 0  # taken, counted up to MERGE_AFTER
        self.weights: tuple[int, ...] = ()
        # the cache (and its count of resets) its weights were last checked for
        self.checked_for: tuple[weakref.ref[KVCache], int] | None = None
        # what the copies above were made from: an in-place change to any of them (their
        # version moves) makes the model read anew
        self.sources = [*model.parameters(), *model.buffers()]
        self.versions = self._versions()

    def _versions(self) -> tuple[int, ...]:
        return tuple(map(_VERSION, self.sources))  # (150 tensors for GPT-2 124M: about 5 us)

    def stale(self, model: GPT) -> bool:
        """Whether a weight was changed in place since the copies were made, or the model
        holds other tensors than it did (a weight or a module replaced, adapters added)."""
        now = [*model.parameters(), *model.buffers()]
        if len(now) != len(self.sources) or any(a is not b for a, b in zip(now, self.sources, strict=True)):
            return True
        return self._versions() != self.versions

    def step(self, lib: ctypes.CDLL, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """The logits (B, V) after each row's new token (tokens: (B,) or (B, 1)), stored in
        cache; their argmax, found by the step while they were in the cores' caches, is kept
        for argmax() (one row of GPT-2's vocabulary: 0.13 ms of numpy's and torch's code just
        after a step, whose weights had pushed that code out of the caches).

        Between steps only Python runs, and it runs slowly: a step streams the weights through
        every cache, and whatever Python, torch and numpy touch next is read anew from memory
        (GPT-2 124M on a Zen 3: 0.55 ms a token, where the same code ran in 0.06 ms warm).
        So a step makes as few torch calls as it can (positions at the slot are the C step's
        own; no copy of tokens already as it takes them)."""
        B, slot = tokens.size(0), cache.pos
        positions = mask = None
        if cache.key_mask is not None:
            cache.key_mask[:, slot] = True
            positions = cache.key_mask[:, :slot].long().sum(1)
            mask = cache.key_mask.to(torch.uint8).contiguous()
        if tokens.dtype != torch.long or not tokens.is_contiguous():
            tokens = tokens.to(torch.long).contiguous()
        self.model.cache_dtype = _DTYPES[cache.k.dtype]
        logits = torch.empty(B, self.vocab, dtype=torch.float32)
        best = torch.empty(B, dtype=torch.long)
        rc = lib.gptcli_decode_step(
            ctypes.byref(self.model),
            ctypes.c_void_p(tokens.data_ptr()),
            ctypes.c_void_p(None if positions is None else positions.data_ptr()),
            B,
            cache.batch_size,
            slot,
            cache.max_len,
            ctypes.c_void_p(cache.k.data_ptr()),
            ctypes.c_void_p(cache.v.data_ptr()),
            ctypes.c_void_p(None if cache.sources is None else cache.sources.data_ptr()),
            ctypes.c_void_p(None if mask is None else mask.data_ptr()),
            ctypes.c_void_p(logits.data_ptr()),
            torch.get_num_threads(),
            ctypes.c_void_p(best.data_ptr()),
        )
        _check(rc, tokens, self.vocab)
        # (inference tensors have no version to tell a change by: found anew for them)
        _LAST_ARGMAX[:] = (
            [None, None, None] if logits.is_inference() else [weakref.ref(logits), logits._version, best]
        )
        cache.pos += 1
        self._count(1)
        return logits

    def run(
        self,
        lib: ctypes.CDLL,
        token: int,
        cache: KVCache,
        n: int,
        choose: int,
        ends: Sequence[int],
        temperature: float,
        u: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """run_steps' C call: ids (k,) and logits (k, V) of k <= n steps."""
        self.model.cache_dtype = _DTYPES[cache.k.dtype]
        logits = torch.empty(n, self.vocab, dtype=torch.float32)
        ids = torch.empty(n, dtype=torch.long)
        stops = torch.tensor(list(ends), dtype=torch.long)
        taken = lib.gptcli_decode_run(
            ctypes.byref(self.model), ctypes.c_int64(token), n, cache.pos, cache.max_len,
            ctypes.c_void_p(cache.k.data_ptr()), ctypes.c_void_p(cache.v.data_ptr()), choose,
            ctypes.c_void_p(stops.data_ptr()), stops.numel(), ctypes.c_float(temperature),
            ctypes.c_void_p(None if u is None else u.data_ptr()), ctypes.c_void_p(logits.data_ptr()),
            ctypes.c_void_p(ids.data_ptr()), torch.get_num_threads(),
        )  # fmt: skip
        _check(min(taken, 0), torch.tensor([token]), self.vocab)
        cache.pos += taken
        self._count(taken)
        # (the Steps given out hold views of the logits: a run cut short keeps only its own)
        return ids[:taken], logits[:taken] if taken == n else logits[:taken].clone()

    def beam_run(
        self,
        lib: ctypes.CDLL,
        tokens: torch.Tensor,
        cache: KVCache,
        n: int,
        choose: int,
        ends: Sequence[int],
        ended: int,
        scores: torch.Tensor,
        k: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """beam_steps' C call: values and index (taken, k) of taken <= n steps."""
        assert cache.sources is not None
        self.model.cache_dtype = _DTYPES[cache.k.dtype]
        values = torch.empty(n, k, dtype=torch.float32)
        index = torch.empty(n, k, dtype=torch.long)
        stops = torch.tensor(list(ends), dtype=torch.long)
        taken = lib.gptcli_beam_run(
            ctypes.byref(self.model), ctypes.c_void_p(tokens.data_ptr()), tokens.size(0), n, cache.pos,
            cache.max_len, ctypes.c_void_p(cache.k.data_ptr()), ctypes.c_void_p(cache.v.data_ptr()),
            ctypes.c_void_p(cache.sources.data_ptr()), choose, ctypes.c_void_p(stops.data_ptr()),
            stops.numel(), ended, ctypes.c_void_p(scores.data_ptr()), k, ctypes.c_void_p(values.data_ptr()),
            ctypes.c_void_p(index.data_ptr()), torch.get_num_threads(),
        )  # fmt: skip
        _check(min(taken, 0), tokens, self.vocab)
        cache.pos += taken
        self._count(taken)
        return values[:taken], index[:taken]

    def _count(self, steps: int) -> None:
        """Count the steps taken up to MERGE_AFTER, then merge the weights' pages (streamed)."""
        if self.steps < MERGE_AFTER:
            self.steps = min(MERGE_AFTER, self.steps + steps)
            if self.steps == MERGE_AFTER and MADV_HUGEPAGE is not None:
                threading.Thread(target=merge_pages, args=(self.streamed(),), daemon=True).start()

    def streamed(self) -> list[torch.Tensor]:
        """The weights every step reads whole: the arena of the products' packed copies, and
        the weights read as stored (the embeddings are only looked up; LayerNorms and biases
        are small). Once the Decoder has taken MERGE_AFTER steps, a thread of its own asks for
        them to be put on huge pages (merge_pages). GPT-2 124M, bf16, on a Zen 3 whose THP
        setting is "madvise": a row took 0.91 and 0.97 of the time with the arena merged (two
        runs of 16 alternated rounds of generate(), 100 tokens each); the C step alone, every
        buffer on huge pages, 0.95 to 0.99 (int8 0.94 to 0.99, fp32 0.94; but weights read as
        stored are torch's, and only their whole 2 MB stretches can be merged: of fp32's, the
        unembedding's and the MLP's). Not at once: the merge takes about 0.6 s of a core for
        bf16's 240 MB (1.6 s for fp32's 500 MB), and asking for huge pages before the copies
        were written made the first token wait up to 1 s more, for the kernel to compact
        memory (bench/RESULTS.md)."""
        mats = [m for layer in self.layers for m in (layer.attn, layer.proj, layer.fc, layer.out)]
        by_address = {t.data_ptr(): t for t in self.keep}
        return [self.arena.memory, *(by_address[m.w] for m in [*mats, self.model.head] if not m.packed)]

    def prefill(self, lib: ctypes.CDLL, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """The logits (1, V) after a prompt's tokens (T,), stored in a cache of one row after
        what it holds, PREFILL_ROWS tokens per call (each call reads the weights once for
        them all; more rows would no longer keep their activations in a core's L2 cache)."""
        tokens = tokens.to(torch.long).contiguous()
        _refuse_outside(tokens, self.vocab)  # (before any part is stored)
        self.model.cache_dtype = _DTYPES[cache.k.dtype]
        logits = torch.empty(1, self.vocab, dtype=torch.float32)
        for start in range(0, tokens.numel(), PREFILL_ROWS):  # (cache.pos moves once all are stored)
            part = tokens[start : start + PREFILL_ROWS]
            last = start + part.numel() == tokens.numel()
            rc = lib.gptcli_prefill(
                ctypes.byref(self.model),
                ctypes.c_void_p(part.data_ptr()),
                part.numel(),
                cache.pos + start,
                cache.max_len,
                ctypes.c_void_p(cache.k.data_ptr()),
                ctypes.c_void_p(cache.v.data_ptr()),
                ctypes.c_void_p(logits.data_ptr() if last else None),
                torch.get_num_threads(),
            )
            _check(rc, part, self.vocab)
        cache.pos += tokens.numel()
        return logits


def _refuse_outside(tokens: torch.Tensor, vocab: int) -> None:
    """An IndexError, as the model's own embedding raises, for ids outside the vocabulary."""
    bad = tokens[(tokens < 0) | (tokens >= vocab)]
    if bad.numel():
        raise IndexError(f"token id {int(bad[0])} is outside the model's embeddings (ids 0 to {vocab - 1})")


def _check(rc: int, tokens: torch.Tensor, vocab: int) -> None:
    """What a C step's return code says: 0 done; -3 an id or a position outside the
    embeddings or the cache (nothing done; IndexError); -2 arguments out of their range (the
    callers' checks missed them: ValueError); else no memory for its buffers."""
    if rc == -2:
        raise ValueError("the decoding kernel was called with arguments out of their range")
    if rc == -3:
        _refuse_outside(tokens, vocab)
        raise IndexError("a position outside the model's embeddings or the KV cache")
    if rc != 0:
        raise MemoryError("the decoding kernel could not allocate its buffers")


def _weights_key(model: GPT) -> tuple[int, ...]:
    """Where the weights are and their versions: changes when the model moves, changes
    dtype (model.to) or has its weights loaded anew in place (load_state_dict)."""
    t = model.transformer
    ends = (
        t.wte.weight,
        t.wpe.weight,
        t.h[0].ln_1.weight,
        t.h[-1].mlp.c_proj.weight,
        t.ln_f.weight,
        model.lm_head.weight,
    )
    return tuple(w.data_ptr() for w in ends) + tuple(w._version for w in ends)


def _cache_fits(model: GPT, cache: KVCache) -> bool:
    """Whether cache is laid out as the C step reads it for this model: keys and values of
    one dtype, (n_layer, batch, max_len, n_head, head_dim), contiguous (a cache made for
    another model would be read and written past its end)."""
    c, k, v = model.config, cache.k, cache.v
    shape = (c.n_layer, cache.batch_size, cache.max_len, c.n_head, c.n_embd // c.n_head)
    return (
        k.shape == shape
        and v.shape == shape
        and v.dtype == k.dtype
        and k.is_contiguous()
        and v.is_contiguous()
        and k.is_cpu
        and v.is_cpu
    )


def _readable(model: nn.Module) -> bool:
    """Whether the C step reads every weight of model as it is: a GPT on the CPU with a plain
    embedding, plain Linears (or Int8Linear) of fp32, bf16 or int8, contiguous. A LoRA
    model's adapters and learning token rows are the model's own code's."""
    if not isinstance(model, GPT) or type(model.transformer.wte) is not nn.Embedding:
        return False
    if model.transformer.wte.weight.device.type != "cpu":
        return False
    return all(
        (type(m) is nn.Linear or isinstance(m, _Quantized))
        and m.weight.dtype in _DTYPES
        and m.weight.is_contiguous()
        for m in _products(model)
    )


def _products(model: GPT) -> list[nn.Module]:
    """The modules whose weights the C step multiplies: each block's four, then the unembedding."""
    t = model.transformer
    linears = [m for b in t.h for m in (b.attn.c_attn, b.attn.c_proj, b.mlp.c_fc, b.mlp.c_proj)]
    return [*linears, model.lm_head]


def _decoder(model: GPT, lib: ctypes.CDLL, idx: torch.Tensor, cache: KVCache | None) -> Decoder | None:
    """The model's Decoder where the C code runs what GPT.next_logits(idx, kv_cache=cache)
    asks (one new token per row, or a prompt of one row, on a growing KV cache, without
    gradients), else None. Called only where nothing else is asked (no probe, no padding mask)."""
    B, T = idx.shape
    prompt = (
        T > 1 and B == 1 and cache is not None and cache.batch_size == 1
        and cache.key_mask is None and cache.sources is None
    )  # fmt: skip
    if not (
        (T == 1 or prompt)
        and cache is not None
        and cache.batch_size == B  # (else the model's own code says what is wrong)
        and not cache.static
        and not torch.is_grad_enabled()
        and cache.k.dtype in (torch.float32, torch.bfloat16)
        and _cache_fits(model, cache)
        and cache.pos + T <= min(cache.max_len, model.config.block_size)
        and idx.device.type == "cpu"
    ):
        return None
    decoder = model.__dict__.get("_decoder")
    # the weights are checked once per generation (a cache, until it is reset), not every
    # token: just after a step has streamed the weights through every core's caches, the
    # check took 0.12 ms of Python, 2% to 4% of a token of GPT-2 124M on a Zen 5
    checked = decoder.checked_for if decoder is not None else None
    if checked is None or checked[0]() is not cache or checked[1] != cache.resets:
        weights = _weights_key(model)
        if decoder is None or decoder.weights != weights or decoder.stale(model):  # new, moved or changed
            model.__dict__.pop("_decoder", None)
            if not _readable(model):  # (adapters added since: the model's own code)
                return None
            decoder = model.__dict__["_decoder"] = Decoder(model, lib)
            decoder.weights = weights
        decoder.checked_for = (weakref.ref(cache), cache.resets)
    return decoder


def _next_logits(self: GPT, idx: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """GPT.next_logits, through the C step where it applies (see _decoder)."""
    cache = kwargs.get("kv_cache")
    lib = LIBRARY.lib
    decoder = None if lib is None or set(kwargs) != {"kv_cache"} else _decoder(self, lib, idx, cache)
    if decoder is not None and cache is not None:
        T = idx.size(1)
        if T == 1:
            return decoder.step(lib, idx, cache)
        if decoder.packed or T <= STORED_PREFILL:
            return decoder.prefill(lib, idx[0], cache)
    return GPT.next_logits(self, idx, **kwargs)


def run_steps(
    model: GPT,
    token: torch.Tensor,
    cache: KVCache,
    n: int,
    choose: int,
    ends: Sequence[int] = (),
    temperature: float = 0.0,
    u: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Up to n decoding steps of one sequence in one C call (gptcli_decode_run): token (1, 1)
    the last id chosen, not yet in cache; each step's logits get -inf past the ids below
    `choose`, and the next id is their argmax (u None) or drawn at the temperature at the
    uniform u[i] (u: (n, 1) float64; as Sampling.draw draws in C); the run stops after an id
    in ends. Returns the ids (k,) and each step's logits (k, V) of the k <= n steps taken
    (their keys stored in cache, but for the last id's; a cache of one row with a key mask
    takes them where every slot it has written is valid); an id of -1 where a row had nothing
    to draw from in C (NaN, +inf or no finite logit: the caller draws it; the run ends
    there). None where the C step does not run this (the caller steps through next_logits)."""
    lib = LIBRARY.lib
    if lib is None or not decodes(model) or n < 1 or token.shape != (1, 1):
        return None
    if cache.sources is not None or cache.pos + n > min(cache.max_len, model.config.block_size):
        return None
    mask = cache.key_mask  # (a server's batch of one: every slot written valid, positions the slots')
    if mask is not None and (mask.size(0) != 1 or not bool(mask[0, : cache.pos].all())):
        return None
    if u is not None and (
        u.dtype != torch.float64 or u.shape != (n, 1) or not u.is_contiguous() or not u.is_cpu
    ):
        return None
    if u is not None and not 0 < temperature <= torch.finfo(torch.float32).max:  # (C takes a float)
        return None
    decoder = _decoder(model, lib, token, cache)
    if decoder is None or not 0 < choose <= decoder.vocab:
        return None
    pos = cache.pos
    run = decoder.run(lib, int(token), cache, n, choose, ends, temperature, u)
    if mask is not None:
        mask[0, pos : cache.pos] = True
    return run


def beam_steps(
    model: GPT,
    tokens: torch.Tensor,
    cache: KVCache,
    n: int,
    choose: int,
    ends: Sequence[int],
    ended: int,
    scores: torch.Tensor,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Up to n steps of beam search in one C call (gptcli_beam_run): tokens (B, 1) each beam's
    next id, not yet in cache (B rows, each beam's slots where `sources` says), scores (B,) the
    beams' scores; `ended` hypotheses set aside so far. Each step ranks the beams' best k
    continuations among the ids below `choose` (best_continuations' values and flat indices),
    and all but the last are taken on by beam_search's rules (ids in ends set aside) in C.
    Returns values (taken, k) and index (taken, k); None where the C step does not run this
    (the caller steps through next_logits)."""
    lib = LIBRARY.lib
    if lib is None or not decodes(model) or n < 1 or tokens.dim() != 2 or tokens.size(1) != 1:
        return None
    B = tokens.size(0)
    if cache.sources is None or cache.key_mask is not None:
        return None
    if cache.pos + n > min(cache.max_len, model.config.block_size):
        return None
    if scores.shape != (B,) or scores.dtype != torch.float32 or not 0 < k <= B * choose:
        return None
    decoder = _decoder(model, lib, tokens, cache)
    if decoder is None or not 0 < choose <= decoder.vocab:
        return None
    tokens = tokens.to(torch.long).contiguous()
    return decoder.beam_run(lib, tokens, cache, n, choose, ends, ended, scores.contiguous(), k)


def decodes(model: nn.Module) -> bool:
    """Whether the model's next_logits goes through the C step where it applies (use_fast_decode)."""
    return getattr(model.__dict__.get("next_logits"), "__func__", None) is _next_logits


def prefills_rows_alone(model: nn.Module) -> bool:
    """Whether prompts are encoded sooner one at a time through the C prefill than together,
    left-padded, through torch's products: bf16 or int8 weights on a CPU without native
    bf16, whose products torch does several times slower there, while each prompt alone
    reads the weights once (about a decoding step). 16 prompts of 3 to 5 tokens, GPT-2 124M
    on a Zen 3: bf16 154 to 187 ms alone against 667 to 692 together, int8 104 to 111
    against 278 to 288; fp32 294 to 330 against 188 to 223 (so fp32 stays together)."""
    slow = next(model.parameters()).dtype == torch.bfloat16 or any(
        isinstance(m, _Quantized) for m in model.modules()
    )
    return LIBRARY.lib is not None and decodes(model) and slow and not cpu_bf16_feature()


# the last step's logits (a weak reference), their version then, and their argmax (B,)
_LAST_ARGMAX: list[Any] = [None, None, None]


def argmax(logits: torch.Tensor) -> torch.Tensor | None:
    """logits.argmax(-1) for fp32 logits (B, V) on the CPU, the same rules (the first largest,
    else the first NaN): as the C step found it where logits are the last step's own, not
    changed since; else in C (gptcli_argmax); None without the library."""
    ref, version, best = _LAST_ARGMAX
    if ref is not None and ref() is logits and logits._version == version:
        _LAST_ARGMAX[:] = [None, None, None]  # (once: a caller may change what it was given)
        return best
    lib = LIBRARY.lib
    if lib is None or logits.dim() != 2 or logits.size(1) == 0 or logits.dtype != torch.float32:
        return None
    if logits.device.type != "cpu" or not logits.is_contiguous():
        return None
    ids = torch.empty(logits.size(0), dtype=torch.long)
    lib.gptcli_argmax(
        ctypes.c_void_p(logits.data_ptr()), logits.size(0), logits.size(1), ctypes.c_void_p(ids.data_ptr())
    )
    return ids


def draw(q: torch.Tensor, u: torch.Tensor) -> torch.Tensor | None:
    """Sampling's inverse-CDF draw (gptcli.infer.generate.draw_from) in C: ids (B,) for q (B, V)
    fp32 on the CPU at the uniforms u (B, 1) float64; None where the library is not loaded
    (torch's code then draws)."""
    lib = LIBRARY.lib
    if lib is None or q.dim() != 2 or q.size(1) == 0 or q.dtype != torch.float32 or u.dtype != torch.float64:
        return None
    if q.device.type != "cpu" or u.device.type != "cpu" or u.dim() != 2 or u.size(0) not in (1, q.size(0)):
        return None
    q, u = q.contiguous(), u.expand(q.size(0), 1).contiguous()  # (one u for every row, as torch broadcasts)
    ids = torch.empty(q.size(0), dtype=torch.long)
    rc = lib.gptcli_draw(
        ctypes.c_void_p(q.data_ptr()), q.size(0), q.size(1), ctypes.c_void_p(u.data_ptr()),
        ctypes.c_void_p(ids.data_ptr()),
    )  # fmt: skip
    return ids if rc == 0 else None


def sample(logits: torch.Tensor, u: torch.Tensor, temperature: float) -> torch.Tensor | None:
    """Sampling from logits (B, V) fp32 on the CPU at a temperature > 0, with no distribution
    written out: ids (B,) where draw(softmax(logits / temperature), u) finds them (but for
    rounding: q's masses are not torch's to the last bit); u (B, 1) float64. None where the
    library is not loaded, or a row holds NaN or +inf or nothing finite (torch's code then
    draws, as it always did)."""
    lib = LIBRARY.lib
    if lib is None or logits.dim() != 2 or logits.size(1) == 0 or logits.dtype != torch.float32:
        return None
    if (
        logits.device.type != "cpu"
        or u.dtype != torch.float64
        or u.shape != (logits.size(0), 1)
        or not u.is_cpu
    ):
        return None
    x, u = logits.contiguous(), u.contiguous()
    ids = torch.empty(x.size(0), dtype=torch.long)
    rc = lib.gptcli_sample(
        ctypes.c_void_p(x.data_ptr()), x.size(0), x.size(1), ctypes.c_float(temperature),
        ctypes.c_void_p(u.data_ptr()), ctypes.c_void_p(ids.data_ptr()), torch.get_num_threads(),
    )  # fmt: skip
    return ids if rc == 0 else None


def logsumexp(x: torch.Tensor) -> torch.Tensor | None:
    """torch.logsumexp(x, -1) for x (rows, V) fp32 on the CPU, in one C pass a row (torch's takes
    0.4 ms for 4 rows of GPT-2's vocabulary); None where the library is not loaded."""
    lib = LIBRARY.lib
    if lib is None or x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu" or x.size(1) == 0:
        return None
    x = x.contiguous()
    out = torch.empty(x.size(0), dtype=torch.float32)
    lib.gptcli_logsumexp(ctypes.c_void_p(x.data_ptr()), x.size(0), x.size(1), ctypes.c_void_p(out.data_ptr()))
    return out


def top_rows(
    x: torch.Tensor, offsets: torch.Tensor, n: int, k: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Beam search's ranking in C: the k largest offsets[r] + x[r, j] over ids j < n of x (rows, V)
    fp32 on the CPU, best first, as values (k,) and flat indices r * V + j (k,), with no
    (rows, V) tensor of sums; entries at -inf never rank (places left over: -inf and -1).
    None where the library is not loaded (torch then ranks: generate.top_of_all)."""
    lib = LIBRARY.lib
    if lib is None or x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu":
        return None
    if not 0 < n <= x.size(1) or k < 1 or offsets.numel() != x.size(0):
        return None
    x, offsets = x.contiguous(), offsets.to("cpu", torch.float32).contiguous()
    values, index = torch.empty(k, dtype=torch.float32), torch.empty(k, dtype=torch.long)
    rc = lib.gptcli_top_rows(
        ctypes.c_void_p(x.data_ptr()), x.size(0), x.size(1), n, ctypes.c_void_p(offsets.data_ptr()), k,
        ctypes.c_void_p(values.data_ptr()), ctypes.c_void_p(index.data_ptr()),
    )  # fmt: skip
    return (values, index) if rc == 0 else None


def best(x: torch.Tensor, scores: torch.Tensor, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """top_rows at offsets = scores - logsumexp(x), in one C call whose threads share the rows:
    beam search's ranking of every beam's continuations (x: the beams' logits (rows, V) fp32
    on the CPU, scores (rows,)). None where the library is not loaded."""
    lib = LIBRARY.lib
    if lib is None or x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu":
        return None
    if not 0 < n <= x.size(1) or k < 1 or scores.numel() != x.size(0) or x.size(0) == 0:
        return None
    x, scores = x.contiguous(), scores.to("cpu", torch.float32).contiguous()
    values, index = torch.empty(k, dtype=torch.float32), torch.empty(k, dtype=torch.long)
    rc = lib.gptcli_best(
        ctypes.c_void_p(x.data_ptr()), x.size(0), x.size(1), n, ctypes.c_void_p(scores.data_ptr()), k,
        ctypes.c_void_p(values.data_ptr()), ctypes.c_void_p(index.data_ptr()), torch.get_num_threads(),
    )  # fmt: skip
    return (values, index) if rc == 0 else None


def use_fast_decode(model: nn.Module) -> bool:
    """Decode through the C step when the model is on the CPU (fp32, bf16 or int8 weights);
    starts building the kernel if this machine has none yet. Returns whether it applies."""
    if not _readable(model):
        return (
            False  # weights it cannot read (adapters, a LoRA run's learning token rows): the model's own code
        )
    LIBRARY.start()
    model.next_logits = types.MethodType(_next_logits, model)  # type: ignore[method-assign]
    return True


def building() -> bool:
    """Whether the kernel is being compiled right now (the first use on this machine)."""
    return LIBRARY.thread is not None and LIBRARY.thread.is_alive()
