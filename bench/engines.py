"""Every engine this machine can run, in one command: time to first chunk, real-time
factor, peak memory, and the wrapper overhead against the library called directly.

    python bench/engines.py [--quick]

Runs, each in its own process so that one's memory peak does not hide another's:

1. ``bench/engines_offline.py``: espeak (against ``espeak_Synth`` through the same binding,
   the baseline) and the synthetic engine;
2. ``bench/mlx_engines.py --http --chatterbox``: qwen3 on a tiny random-weight model against
   mlx-audio's ``generate`` on the same model in the same run, the http engine against
   mlx-audio's own server, and chatterbox against ``Model.generate``.

``ane`` cannot run here (Core ML needs macOS; see README "Engines"). ``--quick`` lowers the
repeats (a smoke run, not figures to quote).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few repeats: a smoke run")
    args = ap.parse_args()
    runs = [
        [str(BENCH / "engines_offline.py"), "--repeats", "2" if args.quick else "20"],
        [str(BENCH / "mlx_engines.py"), "--http", "--chatterbox",
         "--repeats", "1" if args.quick else "5",
         "--chatterbox-repeats", "1" if args.quick else "3"],
    ]
    status = 0
    for argv in runs:
        print(f"$ python {' '.join(Path(a).name if a.endswith('.py') else a for a in argv)}",
              flush=True)
        status |= subprocess.run([sys.executable, *argv]).returncode
        print(flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
