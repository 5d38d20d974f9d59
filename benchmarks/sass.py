"""The SASS of cute_gemm_sm90's promoting FP8 classes, compiled on any machine (no GPU): whether
ptxas kept the wgmma pipeline, and what a consumer warp runs per k-tile.

    CUTE_DSL_ARCH=sm_90a python benchmarks/sass.py [promote block fast]
    python benchmarks/sass.py --cache      # every compiled class in the kernel cache, no compiling

`--cache` reads each cute_gemm_sm90 class that the cache directory of the current build file holds
(build-cache and first uses fill it; $XGEMM_CACHE_DIR) and names the classes whose wgmmas wait one
at a time (wgmma_waits). Those are the classes where ptxas ran short of registers for the pipeline
(C7511): still correct, up to a third slower (docs/performance.md, session 35). Run it before
carrying a cache to the GPU machine.

For each class: the QGMMA count, `WARPGROUP.DEPBAR` waits (one after every QGMMA means ptxas
serialized them), LDGs, and the instruction mix of each k-loop holding a QGMMA (a backward branch
over them). Then ptxas `-v` on the class's PTX, which names the reason for a serialization
(C7514 and the like): triton's ptxas is older than the PTX that CuTe-DSL writes, so the `.version`
line is lowered to the one it takes (the PTX features used are older). cuobjdump and ptxas are
triton's (triton.knobs.nvidia). docs/performance.md ("Session 19") has what this found.
"""
from __future__ import annotations

import collections
import dataclasses
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def classes():
    from xgemm.core.problem import COL, ROW
    from xgemm.kernels import cute_gemm_sm90_build as K90
    cfg = K90.Config(128, 128, 2, 1, False, True, 8)
    promote = K90.Epi(scale_m=True, scale_n=True, promote=True)
    epis = {"fast": K90.Epi(scale_m=True, scale_n=True), "promote": promote,
            "block": dataclasses.replace(promote, block=True)}
    return {name: (lambda out, e=e: K90.build(cfg, "float8_e4m3fn", "bfloat16", ROW, COL, ROW, None, True,
                                              (False,) * 4, 66, "sm_90a", f"--keep-cubin --keep-ptx --dump-dir={out}",
                                              epi=e))
            for name, e in epis.items()}


def loops(sass: str):
    """(first address, length, instruction mix) of each backward-branch loop holding a QGMMA."""
    rows = [(int(m.group(1), 16), m.group(2).strip())
            for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    addrs = [a for a, _ in rows]
    for i, (addr, ins) in enumerate(rows):
        m = re.search(r"\bBRA (0x[0-9a-f]+)", ins)
        if m and int(m.group(1), 16) < addr and int(m.group(1), 16) in addrs:
            body = [text for _, text in rows[addrs.index(int(m.group(1), 16)):i + 1]]
            if any("QGMMA" in b for b in body):
                ops = collections.Counter(b.split()[1 if b.startswith("@") else 0].split(".")[0] for b in body)
                yield int(m.group(1), 16), len(body), ops.most_common(8)


def _ptxas(ptxas: str, ptx: Path, tmp: Path) -> str:
    """ptxas -v's report on the PTX, its .version lowered to what this ptxas says it takes."""
    def run(path: Path) -> str:
        r = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(path), "-o", str(tmp / "x.cubin")],
                           capture_output=True, text=True)
        return r.stdout + r.stderr
    out = run(ptx)
    isa = re.search(r"current version is '([\d.]+)'", out)
    if isa:
        lowered = tmp / "lowered.ptx"
        lowered.write_text(re.sub(r"^\.version \S+", f".version {isa.group(1)}", ptx.read_text(), count=1,
                                  flags=re.M))
        out = run(lowered)
    return out


def wgmma_waits(sass: str) -> tuple:
    """(wgmmas, those that wait alone) in a SASS listing. ptxas gives `gsb0` (and a
    WARPGROUP.DEPBAR after it) to the last wgmma of each batch it keeps in flight, and to every
    wgmma once it serializes them."""
    gmmas = re.findall(r"\b[HQ]GMMA\.[^;]*;", sass)
    return len(gmmas), sum("gsb0" in g for g in gmmas)


def embedded_cubins(obj: bytes):
    """The cubins inside a cached class's object file: CuTe-DSL's export_to_c embeds each as a raw
    ELF image (not a .nv_fatbin section, which cuobjdump would read), so the search is for ELF
    headers past the object's own."""
    starts = [m.start() for m in re.finditer(b"\x7fELF", obj) if m.start() > 0]
    return [obj[a:b] for a, b in zip(starts, starts[1:] + [len(obj)])]


def audit_cache() -> int:
    """Print each cached cute_gemm_sm90 class's wgmma count and lone waits; returns how many are
    serialized (more than one wgmma in four waiting alone: a 64-wide k-tile is 4 k-steps)."""
    import triton.knobs as knobs

    from xgemm.kernels import cute_gemm_sm90 as K90
    from xgemm.kernels import cute_gemm_sm90_build
    from xgemm.runtime import cute_cache
    folder = cute_cache.cute_dir(cute_cache.source_of(cute_gemm_sm90_build.build))
    known = K90.prebuild_classes("sm_90a") + K90.grouped_classes("sm_90a", K90.GROUPED_CONFIGS)
    names = {cute_cache.key_hash(k): k for k, _ in known}
    serialized = 0
    for obj in sorted(folder.glob("*.o")):
        for image in embedded_cubins(obj.read_bytes()):
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(image)
                f.flush()
                sass = subprocess.run([knobs.nvidia.cuobjdump.path, "-sass", f.name], capture_output=True,
                                      text=True).stdout
            gmmas, alone = wgmma_waits(sass)
            if gmmas:
                bad = alone * 4 > gmmas
                serialized += bad
                key = names.get(obj.stem)
                label = f"{key[2]} {key[3:]}" if key else f"{obj.stem} (not a prebuilt class: built on first use)"
                print(f"{'SERIALIZED' if bad else 'ok':10s} {gmmas:3d} wgmmas, {alone:3d} alone  {label}")
                break
    print(f"{serialized} serialized in {folder}")
    return serialized


def main(names) -> None:
    import triton.knobs as knobs
    cuobjdump, ptxas = knobs.nvidia.cuobjdump.path, knobs.nvidia.ptxas.path
    builders = classes()
    for name in names or builders:
        with tempfile.TemporaryDirectory() as tmp:
            builders[name](tmp)
            (cubin,), (ptx,) = Path(tmp).glob("*.cubin"), Path(tmp).glob("*.ptx")
            sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True).stdout
            count = lambda pat: len(re.findall(pat, sass))        # noqa: E731
            print(f"{name}: QGMMA {count(r'QGMMA')}, WARPGROUP.DEPBAR {count(r'WARPGROUP.DEPBAR')}, "
                  f"LDG {count(r'[^U]LDG')}")
            for start, length, mix in loops(sass):
                print(f"  k-loop at {start:#x}: {length} instructions, {mix}")
            info = _ptxas(ptxas, ptx, Path(tmp))
            for line in info.splitlines():
                if "Potential Performance Loss" in line or "Used" in line or "error" in line:
                    print("  ptxas:", re.sub(r" in the function '.*", "", line))


if __name__ == "__main__":
    if sys.argv[1:] == ["--cache"]:
        sys.exit(1 if audit_cache() else 0)
    main(sys.argv[1:])
