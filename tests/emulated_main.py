"""``python tests/emulated_main.py ARGS``: ``python main.py ARGS`` with the CUDA device emulated on the CPU
(``tests.emulated_cuda``), so the CPU tests run every command down its CUDA path."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import main
from tests.emulated_cuda import emulate_cuda

if __name__ == "__main__":
    with emulate_cuda():
        code = main.main(sys.argv[1:])
    sys.exit(code)
