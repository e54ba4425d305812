"""bench case: the CPU decoding kernel as it is built for each instruction set this CPU runs
(gptcli.infer.kernels.ISAS: AVX-512 with BF16 and VNNI, AVX-512 with VNNI, AVX-512, AVX2,
none), GPT-2 124M, greedy, batch 1, in bf16, fp32 and int8, each run beside the memory
bandwidth measured just before and after it. A CPU with AVX-512 BF16 times every code path
that the CPUs without it take, on the same memory: what each path's products make of the
bandwidth, not what an AVX2 CPU's own caches and bandwidth would give.
"""

from __future__ import annotations

import os
import statistics

import torch

from bench.common import Result, beside_bandwidth, decoding_models, gpt2_pair, ours_greedy, scratch
from gptcli.infer import kernels
from gptcli.infer.quantize import weight_bytes


def run(args) -> list[Result]:
    n = 50 if args.quick else 200
    isas = ["native", *(isa for isa in kernels.ISAS if kernels.cpu_has_isa(isa))]
    libraries = {}
    default, kept = kernels.LIBRARY, os.environ.get("GPTCLI_KERNELS_DIR")
    os.environ["GPTCLI_KERNELS_DIR"] = str(scratch("gptcli-bench-isa-"))  # (built anew, left nowhere)
    try:
        for isa in isas:
            lib = kernels._Library(kernels.FLAGS if isa == "native" else kernels.isa_flags(isa))
            lib.start()
            if lib.wait() is None:
                raise RuntimeError(f"the kernel did not build for {isa}: {lib.failed}")
            libraries[isa] = lib
        ms = decoding_models(gpt2_pair()[1])
        prompt = torch.randint(0, 50257, (1, 16), generator=torch.Generator().manual_seed(1))
        tps: dict[tuple[str, str], list[float]] = {(i, k): [] for i in isas for k in ms}
        share: dict[tuple[str, str], list[float]] = {(i, k): [] for i in isas for k in ms}
        for _ in range(args.repeats):  # alternating: this machine's bandwidth moves within a minute
            for isa in isas:
                kernels.LIBRARY = libraries[isa]
                for kind, m in ms.items():
                    m.__dict__.pop("_decoder", None)  # packed for this build (or not packed)
                    assert kernels.use_fast_decode(m)
                    ours_greedy(m, prompt, 4)  # (packs the weights, outside the timing)
                    t, bw = beside_bandwidth(lambda m=m: ours_greedy(m, prompt, n))
                    tps[isa, kind].append(t)
                    share[isa, kind].append(t / (bw / weight_bytes(m)))
    finally:
        kernels.LIBRARY = default
        if kept is None:
            os.environ.pop("GPTCLI_KERNELS_DIR")
        else:
            os.environ["GPTCLI_KERNELS_DIR"] = kept
    out = []
    for isa in isas:
        for kind in ms:
            t = statistics.median(tps[isa, kind])
            native = statistics.median(tps["native", kind])
            bandwidth = statistics.median(share[isa, kind])
            out.append(
                Result(
                    f"greedy decode, GPT-2 124M {kind}, kernel built for {isa}",
                    t,
                    native,
                    "tokens/s",
                    "the kernel built for this CPU (-march=native)",
                    "",
                    None,
                    [
                        f"{n} new tokens after 16, batch 1, the median of {args.repeats} alternating rounds; "
                        f"{100 * bandwidth:.0f}% of the bandwidth measured beside each run (the median; "
                        f"{weight_bytes(ms[kind]) / 1e6:.0f} MB of weights a token)"
                    ],
                )
            )
    return out
