"""Issue 6, torch half: one xgemm call per device, each on that device's own stream.

    python benchmarks/multi_gpu_torch.py --out DIR           # on nvidia-h200-x2 (or larger)
    python benchmarks/multi_gpu_torch.py --smoke             # CPU: the same code on 2 "cpu" devices

The bf16 matmul is split over every GPU three ways (rows of A, columns of B, and K, whose fp32
partial products are summed by --k-sums: a ring of row blocks, or on device 0) and the fp32
softmax by rows. Each split is run by xgemm and by
torch (torch.matmul / torch.softmax) under the same split, and by xgemm on one device with the
whole problem; values are checked on the GPU against torch on one device (integer-valued matmul
operands, so every sum is exact and the check is equality). Per-device TFLOP/s and GB/s come from
the wall time of launching every device's share and synchronizing all devices, median of repeats,
xgemm's repeats interleaved with torch's and with the one-device call's (recorded as
..._one_device_beside_<split>: the single-GPU rate drifts several % between runs, so each split's
ratio to it is taken within the same repeats). --profile DIR writes each K split's GPU timeline.
Writes multi_gpu_torch-h200.json (the issues' record format) and prints a table.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import _harness as h
from _harness import gpu_events


def timeline(torch, step, sync) -> str:
    """One step() under torch.profiler: per device, its GPU kernels and copies (start, duration),
    to see whether the ring's transfers run under the GEMMs."""
    ops = gpu_events(step, sync)
    if not ops:
        return "no GPU events in the trace"
    t0 = min(e["ts"] for e in ops)
    return "\n".join(f"GPU {e['args'].get('device')} stream {e['args'].get('stream')!s:>4} | {e['ts'] - t0:10.1f} us "
                     f"+{e.get('dur', 0):9.1f} | {e.get('name', '')[:70]}"
                     for e in sorted(ops, key=lambda e: (e["args"].get("device", 0), e["ts"])))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(h.RESULTS))
    ap.add_argument("--smoke", action="store_true", help="small shapes on two 'cpu' devices")
    ap.add_argument("--size", type=int, default=16384, help="M = N = K of the bf16 matmul")
    ap.add_argument("--rows", type=int, default=2 ** 15)
    ap.add_argument("--cols", type=int, default=2 ** 16)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--k-sums", default="ring",
                    help="how the K split's partial products are summed, comma-separated, each timed: "
                         "ring (row blocks hop device to device, each transfer under the next block's "
                         "GEMM; the cast row blocks are gathered on device 0), ring_rows (the same, the "
                         "result left row-split over the devices, as a reduce-scatter leaves it) and/or "
                         "reduce (every partial copied to device 0 and summed there, in --k-blocks row "
                         "blocks)")
    ap.add_argument("--k-blocks", type=int, default=4, help="row blocks of the reduce sum")
    ap.add_argument("--k-chunks", type=int, default=2, help="row chunks per ring block")
    ap.add_argument("--profile", default="", help="a folder: write the GPU timeline of one xgemm step of "
                                                  "each K split there (timeline_<split>.txt, torch.profiler)")
    args = ap.parse_args()
    import torch

    import xgemm

    if args.smoke:
        devices = [torch.device("cpu")] * 2
        args.size, args.rows, args.cols, args.reps = 64, 32, 256, 2
        mm_dtype = torch.float32
    else:
        devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
        mm_dtype = torch.bfloat16
    n = len(devices)
    if n < 2:
        print(f"needs 2 or more devices, found {n}", file=sys.stderr)
        return 2
    cuda = devices[0].type == "cuda"
    # each device's own non-default stream: xgemm must launch on the caller's current stream
    streams = [torch.cuda.Stream(device=d) if cuda else None for d in devices]
    reduce_stream = torch.cuda.Stream(device=devices[0]) if cuda else None
    # per device, a stream for peer copies, so a transfer overlaps that device's next GEMM
    copy_streams = [torch.cuda.Stream(device=d) if cuda else None for d in devices]
    dev0 = devices[0]
    records, table = [], []

    def record(case, shape, dt, impl, metric, value, verified):
        records.append(dict(case=case, shape=list(shape), dtype=dt, impl=impl, metric=metric,
                            value=float(value), verified=bool(verified)))
        table.append(f"| {case} | {impl} | {value:9.1f} {metric} | {verified} |")

    @contextlib.contextmanager
    def on(i):
        """Device i and its stream as the current ones."""
        if not cuda:
            yield
            return
        with torch.cuda.device(devices[i]), torch.cuda.stream(streams[i]):
            yield

    def reduce_on():
        return torch.cuda.stream(reduce_stream) if cuda else contextlib.nullcontext()

    def sync():
        if cuda:
            for st in streams + copy_streams + [reduce_stream]:
                st.synchronize()

    def send(x, ready, src, dst, into=None):
        """x (device src, ready after event `ready` on its compute stream) copied to device dst
        (into `into` when given) on the two devices' copy streams -> (copy, event on dst's copy
        stream after it landed)."""
        if not cuda:
            return (x.clone() if into is None else into.copy_(x)), None
        with torch.cuda.stream(copy_streams[src]), torch.cuda.stream(copy_streams[dst]):
            copy_streams[src].wait_event(ready)
            buf = torch.empty(x.shape, dtype=x.dtype, device=devices[dst]) if into is None else into
            buf.copy_(x, non_blocking=True)     # runs on src's copy stream; dst's copy stream waits
            landed = torch.cuda.Event()
            landed.record(copy_streams[dst])
        x.record_stream(copy_streams[src])
        buf.record_stream(streams[dst])
        return buf, landed

    def wall(step, reps):
        """Median wall seconds of step() (launches on every device) plus the synchronization."""
        return walls([step], reps)[0]

    def walls(steps, reps):
        """wall() of each step, their repeats interleaved (order flipped every round) so clock
        and power drift weighs on every impl alike."""
        return h.wall_interleaved(steps, warmup=1, reps=reps, block=lambda _: sync())

    def split(x, dim, parts):
        return [c.contiguous() for c in torch.chunk(x, parts, dim=dim)]

    # ---- bf16 matmul, integer-valued so every split sums exactly
    s = args.size
    g = torch.Generator(device="cpu").manual_seed(0)
    A = torch.randint(-5, 6, (s, s), generator=g).to(dev0, mm_dtype)
    B = torch.randint(-5, 6, (s, s), generator=g).to(dev0, mm_dtype)
    ref = torch.matmul(A, B)
    flops = 2.0 * s ** 3
    k_block = -(-s // args.k_blocks)
    dt = "bf16" if mm_dtype == torch.bfloat16 else "fp32"
    with on(0):
        out1 = torch.full_like(ref, float("nan"))

    def one_device():
        with on(0):
            xgemm.matmul(A, B, out=out1)

    t1 = wall(one_device, args.reps)
    sync()
    record(f"matmul_{dt}_{s}^3_one_device", (s, s, s), dt, "xgemm", "TFLOP/s", flops / t1 / 1e12,
           torch.equal(out1, ref))
    k_sums = [x for x in args.k_sums.split(",") if x]
    for name in ["rows", "cols"] + [f"k_{x}" for x in k_sums]:
        a_parts = split(A, 0, n) if name == "rows" else split(A, 1, n) if name.startswith("k") else [A] * n
        b_parts = split(B, 1, n) if name == "cols" else split(B, 0, n) if name.startswith("k") else [B] * n
        a_parts = [x.to(d) for x, d in zip(a_parts, devices)]
        b_parts = [x.to(d) for x, d in zip(b_parts, devices)]
        sync()
        def build(impl):
            """impl's step() under this split and the list its last run leaves the result in."""
            outs = [None] * n

            def partial(i, a):
                """Device i's fp32 partial product (the sum over devices stays exact)."""
                if impl == "xgemm":
                    return xgemm.gemm(a, b_parts[i], out=torch.empty(a.shape[0], s, device=devices[i],
                                                                     dtype=torch.float32))
                if cuda:   # cuBLAS bf16 x bf16 -> fp32
                    return torch.mm(a, b_parts[i], out_dtype=torch.float32)
                return torch.mm(a.float(), b_parts[i].float())

            def hop(i, a, running, last, out=None):
                """Device i: a @ b_parts[i] plus `running` (the fp32 sum the ring brought so far),
                in fp32, or in the matmul dtype on the last hop (into `out` when given). xgemm takes
                `running` as the kernel's C (beta = 1) and writes the last hop's dtype itself;
                torch adds it with addmm and casts after."""
                if impl == "xgemm":
                    dst = out if out is not None else torch.empty(
                        a.shape[0], s, device=devices[i], dtype=mm_dtype if last else torch.float32)
                    return xgemm.gemm(a, b_parts[i], running, beta=0.0 if running is None else 1.0, out=dst)
                if running is None:
                    p = partial(i, a)
                elif cuda:
                    p = torch.addmm(running, a, b_parts[i], out_dtype=torch.float32)
                else:
                    p = running + a.float() @ b_parts[i].float()
                if not last:
                    return p
                return out.copy_(p) if out is not None else p.to(mm_dtype)

            inboxes = {}

            def inbox(t, d, j, like):
                """Device d's buffer for hop t's running sum of chunk j: allocated by the first step
                (the warm-up) and reused, as XLA's buffers are: a fresh 256 MB block per hop made the
                caching allocator's work land between one device's launch and the next."""
                if (t, d, j) not in inboxes:
                    inboxes[t, d, j] = torch.empty(like.shape, dtype=like.dtype, device=devices[d])
                return inboxes[t, d, j]

            def ring(gather):
                """Row block b of the result is summed along a ring: at step t device d computes
                its partial of block (d + t + 1) % n plus what device d + 1 sent for that block, and
                sends the sum on to d - 1 (a copy-engine transfer under d's next GEMM); after n - 1
                hops device d holds block d in the matmul dtype, gathered on device 0 (or, without
                gather, left there: the result row-sharded, as a reduce-scatter leaves it). Blocks
                go in --k-chunks row chunks, step by step, so each chunk's transfer and gather has
                the next chunk's GEMM to hide under."""
                rows = s // n
                sub = rows // args.k_chunks
                if gather:
                    with on(0):
                        total = torch.empty(s, s, device=dev0, dtype=mm_dtype)
                else:
                    for d in range(n):
                        outs[d] = []
                recv, landings = {}, []
                for t in range(n):
                    last, sent = t == n - 1, {}
                    for j in range(args.k_chunks):
                        made = []
                        for d in range(n):    # every device's GEMM first: no send's setup delays a launch
                            r0 = (d + t + 1) % n * rows + j * sub
                            with on(d):
                                running = None
                                if (d, j) in recv:
                                    running, landed = recv.pop((d, j))
                                    if cuda:
                                        streams[d].wait_event(landed)
                                into = total[r0:r0 + sub] if gather and last and d == 0 else None
                                p = hop(d, a_parts[d][r0:r0 + sub], running, last, into)
                                ready = torch.cuda.Event() if cuda else None
                                if cuda:
                                    ready.record()
                            made.append((d, r0, p, ready))
                        for d, r0, p, ready in made:
                            if not last:
                                sent[(d - 1) % n, j] = send(p, ready, d, (d - 1) % n, into=inbox(t, (d - 1) % n, j, p))
                            elif not gather:
                                outs[d].append(p)
                            elif d != 0:
                                landings.append(send(p, ready, d, 0, into=total[r0:r0 + sub])[1])
                    recv = sent
                if gather:     # device 0 waits for the pieces only now: a wait issued between its
                    for landed in landings:      # hops would hold its next GEMM for a peer's piece
                        if cuda:
                            streams[0].wait_event(landed)
                    outs[0] = total

            def step():
                if name in ("k_ring", "k_ring_rows"):
                    return ring(gather=name == "k_ring")
                if not name.startswith("k"):
                    for i in range(n):
                        with on(i):
                            outs[i] = (xgemm.matmul if impl == "xgemm" else torch.matmul)(a_parts[i], b_parts[i])
                    return
                # K split: row blocks, so block j's peer copies (copy engine) and sum on device 0
                # (reduce stream) run under block j+1's GEMMs; the same pipeline for both impls
                with on(0):
                    total = torch.empty(s, s, device=dev0, dtype=mm_dtype)
                for r0 in range(0, s, k_block):
                    done = []
                    for i in range(n):
                        with on(i):
                            p = partial(i, a_parts[i][r0:r0 + k_block])
                            ev = torch.cuda.Event() if cuda else None
                            if cuda:
                                ev.record()
                            done.append((p, ev))
                    with reduce_on():
                        acc = None
                        for i, (p, ev) in enumerate(done):
                            if cuda:
                                reduce_stream.wait_event(ev)
                                p.record_stream(reduce_stream)
                            p = p.to(dev0, non_blocking=True)
                            acc = p if acc is None else acc + p
                        total[r0:r0 + k_block] = acc
                outs[0] = total
                if cuda:
                    streams[0].wait_stream(reduce_stream)

            return step, outs

        built = {impl: build(impl) for impl in ("xgemm", "torch")}
        # the one-device call is timed again among this split's repeats: its rate drifts by several
        # % between runs (clock, power), so the ratio the issue asks for is taken beside it
        *times, t_one = walls([step for step, _ in built.values()] + [one_device], args.reps)
        record(f"matmul_{dt}_{s}^3_one_device_beside_{name}", (s, s, s), dt, "xgemm", "TFLOP/s",
               flops / t_one / 1e12, torch.equal(out1, ref))
        if args.profile and cuda and name.startswith("k"):
            Path(args.profile).mkdir(parents=True, exist_ok=True)
            Path(args.profile, f"timeline_{name}.txt").write_text(timeline(torch, built["xgemm"][0], sync))
        for (impl, (_, outs)), t in zip(built.items(), times):
            if name == "k_ring_rows":
                got = torch.cat([x.to(dev0) for o in outs for x in o], dim=0)
            elif name.startswith("k"):
                got = outs[0]
            else:
                got = torch.cat([o.to(dev0) for o in outs], dim=0 if name == "rows" else 1)
            record(f"matmul_{dt}_{s}^3_split_{name}_per_device", (s, s, s), dt, impl, "TFLOP/s",
                   flops / t / n / 1e12, torch.equal(got, ref))
        del a_parts, b_parts, built, outs, got
    del A, B, ref, out1

    # ---- fp32 softmax, rows split
    r, c = args.rows, args.cols
    X = torch.randn(r, c, device=dev0, generator=torch.Generator(device=dev0).manual_seed(1)) * 3
    ref = torch.softmax(X, dim=-1)
    nbytes = 2.0 * r * c * 4
    close = lambda y: bool(torch.allclose(y, ref, rtol=1e-5, atol=1e-7))
    with on(0):
        y1 = torch.full_like(X, float("nan"))
        t1 = wall(lambda: xgemm.softmax(X, out=y1), args.reps)
        sync()
        record(f"softmax_fp32_{r}x{c}_one_device", (r, c), "fp32", "xgemm", "GB/s", nbytes / t1 / 1e9, close(y1))
    del y1
    x_parts = [x.to(d) for x, d in zip(split(X, 0, n), devices)]
    def softmax_step(impl):
        outs = [None] * n

        def step():
            for i in range(n):
                with on(i):
                    outs[i] = xgemm.softmax(x_parts[i]) if impl == "xgemm" else torch.softmax(x_parts[i], dim=-1)
        return step, outs

    built = {impl: softmax_step(impl) for impl in ("xgemm", "torch")}
    for (impl, (_, outs)), t in zip(built.items(), walls([step for step, _ in built.values()], args.reps)):
        got = torch.cat([o.to(dev0) for o in outs], dim=0)
        record(f"softmax_fp32_{r}x{c}_split_rows_per_device", (r, c), "fp32", impl, "GB/s",
               nbytes / t / n / 1e9, close(got))
        del got
    del built, outs

    records.append({"meta": {"date": time.strftime("%Y-%m-%d"), "devices": [str(d) for d in devices],
                             "gpu": torch.cuda.get_device_name(0) if cuda else "cpu",
                             "torch": torch.__version__, "command": " ".join(sys.argv)}})
    print("| case | impl | value | verified |\n|---|---|---|---|\n" + "\n".join(table))
    if not args.smoke:
        h.write_json(h.result_path("multi_gpu_torch", out=args.out), records)
    bad = [x["case"] + "/" + x["impl"] for x in records if "meta" not in x and not x["verified"]]
    if bad:
        print(f"FAILED: unverified {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
