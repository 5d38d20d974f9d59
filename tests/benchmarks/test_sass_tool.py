"""benchmarks/sass.py's SASS reading on the CPU, on synthetic input in cuobjdump's format: the
k-loops it finds (a backward branch over a QGMMA) and their instruction mix, the wgmmas that wait
alone, and the cubins found in a cached class's object file."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("sass_tool", ROOT / "benchmarks" / "sass.py")
sass_tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sass_tool)

LISTING = """
        /*0100*/                   MOV R1, c[0x0][0x28] ;
        /*0110*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR20], R24, gsb0 ;
        /*0120*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0130*/                   FADD R2, R2, R24 ;
        /*0140*/               @P0 BRA 0x110 ;
        /*0150*/                   FADD R3, R3, R4 ;
        /*0160*/               @P1 BRA 0x150 ;
        /*0170*/                   EXIT ;
"""


def test_loops_are_backward_branches_over_a_qgmma():
    (start, length, mix), = list(sass_tool.loops(LISTING))      # the FADD-only loop at 0x150 is not one
    assert (start, length) == (0x110, 4)
    assert dict(mix) == {"QGMMA": 1, "WARPGROUP": 1, "FADD": 1, "BRA": 1}


def test_wgmma_waits_counts_the_wgmmas_that_wait_alone():
    batch = "".join(f"        /*{0x200 + 16 * i:04x}*/                   HGMMA.64x192x16.F32.BF16 R24, gdesc[UR16], R24"
                    f"{', gsb0' if i == 3 else ''} ;\n" for i in range(4))
    assert sass_tool.wgmma_waits(batch + "        /*0240*/ WARPGROUP.DEPBAR.LE gsb0, 0x1 ;\n") == (4, 1)
    assert sass_tool.wgmma_waits(LISTING) == (1, 1)          # the QGMMA above waits alone
    assert sass_tool.wgmma_waits("        /*0100*/ FADD R2, R2, R3 ;\n") == (0, 0)


def test_embedded_cubins_are_the_elf_images_past_the_objects_own_header():
    obj = b"\x7fELF host object" + b"\x00" * 8 + b"\x7fELF first" + b"\x7fELF second"
    assert sass_tool.embedded_cubins(obj) == [b"\x7fELF first", b"\x7fELF second"]
    assert sass_tool.embedded_cubins(b"\x7fELF only the host object") == []
