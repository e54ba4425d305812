"""Where and how the math runs: device, precision (with the reason it was chosen), seeding,
and the peak FLOP/s that MFU is measured against."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from gptcli.cpuinfo import cpu_bf16_feature, cpu_fields
from gptcli.errors import GptcliError, UsageError
from gptcli.paths import cache_dir

T = TypeVar("T")

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def weights_dtype(model: torch.nn.Module) -> str:
    """What a model's floating-point weights are held in, by the name --dtype gives it."""
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    return next((name for name, d in _DTYPES.items() if d == dtype), str(dtype).removeprefix("torch."))


def pick_device(requested: str = "auto") -> tuple[torch.device, str]:
    """The torch device for `requested` (auto|cpu|cuda|cuda:N|mps) and why it was picked."""
    kind = requested.split(":")[0]
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda"), f"CUDA: {torch.cuda.get_device_name()}"
        if torch.backends.mps.is_available():
            return torch.device("mps"), "Apple MPS"
        return torch.device("cpu"), f"CPU: {cpu_name()}, {_threads()} (no GPU found)"
    if kind == "cuda":
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise UsageError(
                f"--device {requested}: no CUDA device is available (torch {torch.__version__}, {build}); "
                "use --device cpu, or install a CUDA build of torch"
            )
        device = torch.device(requested)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"--device {requested}: only {torch.cuda.device_count()} CUDA device(s) present")
        return device, f"CUDA: {torch.cuda.get_device_name(device)}"
    if kind == "mps":
        if not torch.backends.mps.is_available():
            raise UsageError("--device mps: Apple MPS is not available on this machine; use --device cpu")
        return torch.device("mps"), "Apple MPS"
    if kind == "cpu":
        return torch.device("cpu"), f"CPU: {cpu_name()}, {_threads()}"
    raise UsageError(f"unknown device {requested!r}; use auto, cpu, cuda, cuda:N or mps")


def _threads() -> str:
    n = torch.get_num_threads()
    return f"{n} thread{'s' if n != 1 else ''}"


def cpu_name() -> str:
    return cpu_fields().get("model name") or platform.processor() or platform.machine()


@dataclass(frozen=True)
class Precision:
    """How the forward and backward passes run: fp32, or bf16/fp16 autocast over fp32 weights."""

    name: str  # fp32 | bf16 | fp16
    device_type: str
    reason: str

    @property
    def dtype(self) -> torch.dtype:
        return _DTYPES[self.name]

    @property
    def needs_grad_scaler(self) -> bool:
        return self.name == "fp16"

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)


def _check_dtype(device: torch.device, requested: str) -> None:
    """Refuse a --dtype that is unknown or that the device cannot run."""
    if requested not in ("auto", *_DTYPES):
        raise UsageError(f"unknown dtype {requested!r}; use auto, fp32, bf16 or fp16")
    if requested == "fp16" and device.type == "cpu":
        raise UsageError("--dtype fp16 is for GPUs; on the CPU use bf16 or fp32")
    if requested == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageError("--dtype bf16: this GPU does not support bf16; use --dtype fp16 or auto")


def fp32_matmuls(device: torch.device, requested: str) -> str:
    """Set how float32 matmuls run, and say so for the run header: on CUDA, `auto` lets them
    use TF32 tensor cores (Ampere and later; what autocast leaves in fp32, and fp32 runs);
    `--dtype fp32` asks for exact fp32, everywhere. Other devices compute fp32 exactly."""
    exact = requested == "fp32" or device.type != "cuda"
    torch.set_float32_matmul_precision("highest" if exact else "high")
    if device.type != "cuda":
        return ""
    return "; fp32 matmuls exact (no TF32)" if exact else "; fp32 matmuls in TF32"


def pick_precision(device: torch.device, requested: str = "auto") -> Precision:
    """`auto`: bf16 autocast on CUDA with bf16 and on CPUs with native bf16 matmul, fp16 with a
    gradient scaler on older GPUs, fp32 otherwise. An explicit choice is checked, not trusted.
    Also sets how fp32 matmuls run (fp32_matmuls)."""
    _check_dtype(device, requested)
    kind = device.type
    if kind == "cuda":
        tf32 = fp32_matmuls(device, requested)
        if requested == "auto":
            if torch.cuda.is_bf16_supported():
                return Precision("bf16", kind, "bf16 autocast: this GPU supports bf16" + tf32)
            return Precision("fp16", kind, "fp16 autocast + gradient scaler: this GPU has no bf16" + tf32)
        return Precision(requested, kind, f"{requested}: as requested" + tf32)
    fp32_matmuls(device, requested)
    if kind == "mps":
        if requested in ("auto", "fp32"):
            return Precision("fp32", kind, "fp32: autocast is not used on MPS by default")
        return Precision(requested, kind, f"{requested} autocast on MPS: as requested")
    feature = cpu_bf16_feature()
    if requested == "auto":
        if feature:
            return Precision("bf16", kind, f"bf16 autocast: this CPU has native bf16 matmul ({feature})")
        return Precision("fp32", kind, "fp32: this CPU has no native bf16 matmul")
    reason = f"{requested}: as requested"
    if requested == "bf16" and not feature:
        reason += " (this CPU has no native bf16 matmul: expect it to be slow)"
    return Precision(requested, kind, reason)


# decoding reads every weight once per token, so its speed is set by bytes of weights;
# below this size the model fits in cache and bf16 only adds conversions
BF16_DECODE_MIN_PARAMS = 50_000_000


def pick_inference_dtype(
    device: torch.device,
    requested: str,
    n_params: int,
    quantize: str | None = None,
    bf16_kernel: str | None = None,
) -> tuple[torch.dtype, str]:
    """The dtype to hold weights in for sampling and inspection, and why (and how fp32
    matmuls run, see fp32_matmuls). quantize: the weights the products keep instead
    (--quantize int8), the dtype then being the activations'. bf16_kernel: for a verb
    that decodes through the CPU kernel, the instruction set it multiplies bf16 weights
    with on a CPU without native bf16 (kernels.bf16_products), if any: a large model then
    decodes in bf16 too (half the bytes a token; torch's own bf16 products, which eval and
    inspection run, are slow there)."""
    _check_dtype(device, requested)
    tf32 = fp32_matmuls(device, requested)  # (it sets how they run, whatever the dtype)
    name, reason = _inference_dtype(device, requested, n_params, None if quantize else bf16_kernel)
    reason += tf32 if requested == "fp32" else ""
    if quantize is not None:
        return _DTYPES[name], f"{quantize} weights (quantized at load), {name} activations: {reason}"
    return _DTYPES[name], f"{name}{'' if requested != 'auto' else ' weights'}: {reason}"


def _inference_dtype(
    device: torch.device, requested: str, n_params: int, bf16_kernel: str | None
) -> tuple[str, str]:
    """(dtype name, why) for pick_inference_dtype."""
    if requested != "auto":
        return requested, "as requested"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", "this GPU supports bf16"
        return "fp16", "this GPU has no bf16"
    if device.type == "cpu" and cpu_bf16_feature() and n_params >= BF16_DECODE_MIN_PARAMS:
        return "bf16", f"a large model on a CPU with native bf16 ({cpu_bf16_feature()})"
    if device.type == "cpu" and bf16_kernel and n_params >= BF16_DECODE_MIN_PARAMS:
        return "bf16", f"a large model, decoded by the CPU kernel's bf16 products ({bf16_kernel})"
    if device.type == "cpu" and (cpu_bf16_feature() or bf16_kernel):
        return "fp32", f"a model under {BF16_DECODE_MIN_PARAMS // 10**6}M parameters"
    return "fp32", "this CPU has no native bf16" if device.type == "cpu" else "the default"


# --- memory: refuse what cannot fit before allocating it --------------------------------------


class OutOfMemory(GptcliError):
    """What a command needs is more memory than the device has free (found before
    allocating: a request far beyond the machine would otherwise get the process killed)."""

    exit_code = 2

    def __init__(self, what: str, needed: int, free: int, device: torch.device) -> None:
        self.where = "the GPU" if device.type == "cuda" else "this machine"
        self.what, self.needed, self.free = what, needed, free
        super().__init__(
            f"out of memory on {self.where}: {what} needs at least {_gigabytes(needed)}, "
            f"{_gigabytes(free)} are free"
        )


def _gigabytes(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n < 10**18 else "more than a billion GB"  # (a float cannot hold every int)


def free_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on device (the CPU: MemAvailable), None if unknown."""
    if device.type == "cuda":  # what PyTorch holds in its cache but no tensor uses is free to it too
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(torch.cuda.mem_get_info(device)[0]) + cached
    if device.type != "cpu":
        return None
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    room = _cgroup_room()
    return room if free is None else free if room is None else min(free, room)


def _cgroup_room() -> int | None:
    """Bytes the process's memory cgroup (a container's limit) still allows, if it has one."""
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # "max", or v1's "no limit" of about 2**63
            return max(0, int(limit) - usage)
    return None


def check_fits(needed: int, device: torch.device, what: str) -> None:
    """Raise OutOfMemory if needed bytes cannot fit in what device has free."""
    free = free_memory(device)
    if free is not None and needed > free:
        raise OutOfMemory(what, needed, free, device)


def kv_cache_bytes(config: Any, rows: int, dtype: torch.dtype, positions: int = 1) -> int:
    """The keys and values of rows sequences at `positions` positions, in every layer."""
    item = torch.empty((), dtype=dtype).element_size()
    return 2 * config.n_layer * rows * positions * config.n_embd * item


def decoding_bytes(config: Any, rows: int, dtype: torch.dtype, length: int | None = None) -> int:
    """A lower bound on what decoding rows sequences at once needs beyond the weights: the
    KV cache (length positions, default the model's block_size), and the float32 logits
    that sampling works on."""
    positions = min(length or config.block_size, config.block_size)
    cache = kv_cache_bytes(config, rows, dtype, positions)
    return cache + 4 * rows * (config.vocab_size or 0) * 4


def training_bytes(
    config: Any, params: int, batch_size: int, precision: Precision, fused_attention: bool
) -> int:
    """A lower bound on what training needs beyond the weights: gradients and AdamW's two
    moments (float32); one micro-batch's activations, at least the 32 bytes per token and
    width that each block saves for backward in 16 bits (Korthikanti et al. 2022, without
    dropout masks), plus the softmaxed attention matrix where attention is not fused
    (2*a*s/h); and the logits in float32."""
    s, h, a = config.block_size, config.n_embd, config.n_head
    per_token = 32 + (0 if fused_attention else 2 * a * s / h)
    per_layer = batch_size * s * h * per_token * (2 if precision.name == "fp32" else 1)
    logits = batch_size * s * (config.vocab_size or 0) * 4
    return int(12 * params + config.n_layer * per_layer + logits)


# glibc's malloc hands large freed blocks straight back to the kernel (munmap, heap
# trimming), so a CPU training step, which frees and reallocates the same activations every
# step, page-faults them in afresh each time: about 90,000 faults and 0.2 s of kernel time
# per step on the 6-layer benchmark model, 10 to 20% of the step. Keeping freed memory in
# the process for the next step (as jemalloc or tcmalloc would) removes them; peak memory
# stays within a few percent of what it was.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's malloc.h
_MMAP_THRESHOLD = 1 << 30  # blocks below 1 GiB come from the heap, not from their own mmap
_TRIM_THRESHOLD = 2**31 - 1  # and the heap is trimmed only when 2 GiB at its top are free


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep memory freed by this process for reuse rather than return it
    to the kernel, which maps fresh memory in page by page, a fault each, on first touch. For
    CPU training (every step's activations) and CPU decoding (every generation's KV cache,
    every step's logits); the process keeps its peak memory. A no-op (False) where the C
    library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)  # also seeds every CUDA device


# dense (no sparsity) bf16/fp16 tensor-core peaks from the datasheets, FLOP/s, keyed by the
# exact name torch.cuda.get_device_name() gives: a similar name may be another part
# (an H100 PCIe is 756 TFLOP/s, an H100 SXM 989). A GPU not listed has no MFU.
GPU_PEAKS = {
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H100 NVL": 835e12,
    "NVIDIA H200": 989e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100-PCIE-40GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
    "NVIDIA L40S": 362e12,
    "NVIDIA GeForce RTX 4090": 165e12,  # with fp32 accumulation, as autocast uses
    "NVIDIA GeForce RTX 3090": 71e12,
    "NVIDIA L4": 121e12,
    "NVIDIA A10": 125e12,
    "Tesla V100-SXM2-16GB": 125e12,
    "Tesla V100-SXM2-32GB": 125e12,
    "Tesla V100-PCIE-16GB": 112e12,
    "Tesla V100-PCIE-32GB": 112e12,
    "Tesla T4": 65e12,
}


def peak_flops(device: torch.device, precision: Precision) -> float | None:
    """Peak FLOP/s to measure MFU against, or None where it is not known: the datasheet for
    the GPUs of GPU_PEAKS in bf16/fp16; on the CPU, a measured matmul peak (cached per
    machine, and raised by record_achieved when a run goes faster)."""
    if device.type == "cuda":
        if precision.name == "fp32":
            return None  # TF32 or not, and the datasheets disagree: no honest figure
        return GPU_PEAKS.get(torch.cuda.get_device_name(device))
    if device.type == "mps":
        return None
    return measured_peak_flops(device, precision.dtype)


def _peak_key(device: torch.device, dtype: torch.dtype) -> str:
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return f"{label}|{device.type}|{dtype}|{torch.get_num_threads()}|{torch.__version__}"


def _peak_file() -> Path:
    return cache_dir() / "peak_flops.json"


def _read_peaks() -> dict[str, float]:
    try:
        known = json.loads(_peak_file().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(known, dict):
        return {}
    return {
        k: float(v) for k, v in known.items() if isinstance(v, (int, float)) and math.isfinite(v) and v > 0
    }


def _remember_peak(key: str, flops: float) -> None:
    """Keep the highest peak seen for key (a measurement on a busy machine is too low)."""
    from gptcli.files import write_file

    known = _read_peaks()
    if flops <= known.get(key, 0.0):
        return
    known[key] = flops
    with contextlib.suppress(OSError, GptcliError):  # a cache that cannot be written is no reason to stop
        _peak_file().parent.mkdir(parents=True, exist_ok=True)
        write_file(_peak_file(), json.dumps(known, indent=1))


def measured_peak_flops(device: torch.device, dtype: torch.dtype, seconds: float = 0.5) -> float:
    """Best matmul throughput of this device in dtype, remembered in the cache directory:
    measured for `seconds` the first time, then probed for a fifth of that at every call (a
    first measurement on a busy machine is too low, and stayed so: MFU read too high until
    a later, idler run raises it)."""
    key = _peak_key(device, dtype)
    known = _read_peaks().get(key, 0.0)
    if known:
        seconds /= 5
    n = 2048 if device.type == "cuda" else 1024
    gen = torch.Generator(device=device).manual_seed(0)  # leave the global RNG alone
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = max(best, 4 * 2 * n**3 / (time.perf_counter() - t0))
    _remember_peak(key, best)
    return max(best, known)


def record_achieved(device: torch.device, precision: Precision, peak: float, flops: float) -> float:
    """The peak to use from now on, given that a run achieved `flops` per second on one
    device: a measured peak below what was achieved was measured on a busy machine, so
    it is raised to the achieved rate (and remembered). Datasheet peaks stay as they are."""
    if flops <= peak or device.type == "cuda":
        return peak
    _remember_peak(_peak_key(device, precision.dtype), flops)
    return flops


# --- many processes: torchrun ---------------------------------------------------------------


@dataclass(frozen=True)
class Dist:
    """This process's place in a torchrun job (rank 0 of 1 when run on its own)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def gather(self, value: Any) -> list[Any]:
        """value from every process, in rank order (a list of one when alone; collective)."""
        if not self.enabled:
            return [value]
        import torch.distributed as td

        out: list[Any] = [None] * self.world
        td.all_gather_object(out, value)
        return out

    def reduce(self, t: torch.Tensor, op: str = "avg") -> torch.Tensor:
        """t averaged (op "avg") or maxed ("max") over every process, in place (collective)."""
        if self.enabled:
            import torch.distributed as td

            if op == "avg":
                td.all_reduce(t, op=td.ReduceOp.SUM)
                t /= self.world
            else:
                td.all_reduce(t, op=td.ReduceOp.MAX)
        return t


def dist_from_env() -> Dist:
    """The job layout torchrun puts in the environment (RANK, WORLD_SIZE, LOCAL_RANK)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    return Dist(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))


DIST_TIMEOUT = 7200.0  # seconds: config.TrainConfig.dist_timeout's default


def init_distributed(device: torch.device, timeout: float = DIST_TIMEOUT) -> Dist:
    """Join the torchrun process group: NCCL between GPUs, gloo on CPUs. No-op when alone.
    timeout: how long a collective waits for every process; NCCL's own default (10 minutes)
    is shorter than tokenizing a large corpus on one process while the others wait."""
    dist = dist_from_env()
    if not dist.enabled:
        return dist
    import datetime

    import torch.distributed as td

    if not td.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        td.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout))
    return dist


def rank_device(requested: str, dist: Dist) -> tuple[torch.device, str]:
    """pick_device, with each process of a torchrun job on its own GPU (cuda:LOCAL_RANK)."""
    device, why = pick_device(requested)
    if dist.enabled and device.type == "cuda" and device.index is None:
        visible = torch.cuda.device_count()
        if dist.local_rank >= visible:
            raise UsageError(
                f"this process is local rank {dist.local_rank} of a torchrun job, but only {visible} CUDA "
                f"device(s) are visible on this machine: start at most {visible} processes per node "
                "(--nproc-per-node), or check CUDA_VISIBLE_DEVICES"
            )
        device = torch.device("cuda", dist.local_rank)
        why = f"CUDA: {torch.cuda.get_device_name(device)} (rank {dist.rank} of {dist.world})"
    elif dist.enabled:
        why += f" (rank {dist.rank} of {dist.world})"
    return device, why


def shared_setup(device_request: str, prepare: Callable[[], T], timeout: float = DIST_TIMEOUT) -> T:
    """Run prepare() once per job under torchrun and give every process its result.

    Each node's first process runs it (so a cache it fills is local to the node), the
    others wait; then every process runs it again, cheaply, to learn the result (a cache
    hit). Alone, it just runs prepare(). Values that must agree across processes (the run
    directory) are then taken from rank 0 with broadcast_from_main."""
    dist = dist_from_env()
    if not dist.enabled:
        return prepare()
    import torch.distributed as td

    device, _ = rank_device(device_request, dist)
    init_distributed(device, timeout)
    failure: list[str | None] = [None]
    result = None
    if dist.local_rank == 0:
        try:
            result = prepare()
        except UsageError as e:
            failure = [str(e)]
    td.all_gather_object(failures := [None] * dist.world, failure[0])
    problems = [f for f in failures if f]
    if problems:
        raise UsageError(problems[0])
    if dist.local_rank != 0:
        result = prepare()
    return result


def broadcast_from_main(value: Any) -> Any:
    """rank 0's value on every process (value itself when alone)."""
    if not dist_from_env().enabled:
        return value
    import torch.distributed as td

    box = [value]
    td.broadcast_object_list(box, src=0)
    return box[0]
