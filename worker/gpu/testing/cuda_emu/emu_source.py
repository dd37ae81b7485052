"""Rewrites a .cu file for the CPU emulator in cuda_runtime.h.

  python3 emu_source.py IN.cu OUT.cc

`kernel<<<grid, block, smem, stream>>>(args)` becomes
`EmuLaunch(kernel, grid, block, smem, stream)(args)`; nothing else changes
(the emulator's headers shadow <cuda_runtime.h>).
"""
import re
import sys

src = open(sys.argv[1]).read()
out = re.sub(r"(\w+)<<<(.*?)>>>\(", r"EmuLaunch(\1, \2)(", src, flags=re.S)
open(sys.argv[2], "w").write(out)
