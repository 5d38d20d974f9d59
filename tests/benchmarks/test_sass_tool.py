"""benchmarks/sass.py's SASS reading on the CPU: the k-loops it finds (a backward branch over a
QGMMA) and their instruction mix, on a synthetic listing in cuobjdump's format."""
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
