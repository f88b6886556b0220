"""What grew in the gateway's heap between two of bench/soak.py's ``--heap-dumps``.

    python bench/heap_diff.py DIR A B [--top 15] [--group lineno|traceback]

``A`` and ``B`` are dump numbers (``heap-<A>``, ``heap-<B>``): the RSS of each (before and
after ``malloc_trim``, unless ``--heap-no-trim``; and the free bytes glibc kept), the types
whose live objects grew most in number (``gc.get_objects``, after a collection), and with
``--heap-trace`` dumps the traced total and the allocation sites whose traced memory grew
most (tracemalloc's ``compare_to``; ``traceback``: the 8 frames kept, not the line alone).
"""

from __future__ import annotations

import argparse
import json
import tracemalloc
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir")
    p.add_argument("a", type=int)
    p.add_argument("b", type=int)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--group", choices=("lineno", "traceback"), default="lineno")
    args = p.parse_args()
    folder = Path(args.dir)
    heads = [json.loads((folder / f"heap-{n}.json").read_text()) for n in (args.a, args.b)]
    for n, h in zip((args.a, args.b), heads, strict=True):
        traced = "" if h["traced_bytes"] is None else \
            f", traced {h['traced_bytes'] / 2**20:.2f} MiB"
        trimmed = "not trimmed" if h["rss_trimmed_kb"] is None else \
            f"{h['rss_trimmed_kb'] / 1024:.1f} trimmed"
        kept = "" if h.get("malloc") is None else \
            f", malloc keeps {h['malloc']['fordblks'] / 2**20:.1f} MiB free"
        print(f"heap-{n}: RSS {h['rss_kb'] / 1024:.1f} MB ({trimmed}){kept}{traced}, "
              f"{h['objects']:,} objects")
    before, after = heads[0]["by_type"], heads[1]["by_type"]
    grown = sorted(((after.get(t, 0) - before.get(t, 0), t) for t in set(before) | set(after)),
                   reverse=True)
    print("\nobjects by type, most grown:")
    for d, t in grown[: args.top]:
        if d:
            print(f"  {d:+8,}  {t} ({after.get(t, 0):,})")
    if heads[0]["traced_bytes"] is None or heads[1]["traced_bytes"] is None:
        return
    snaps = [tracemalloc.Snapshot.load(str(folder / f"heap-{n}.snap")) for n in (args.a, args.b)]
    snaps = [s.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)]) for s in snaps]
    print(f"\ntraced memory, most grown ({args.group}):")
    for stat in snaps[1].compare_to(snaps[0], args.group)[: args.top]:
        print(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7,} blocks  "
              f"(now {stat.size / 1024:.1f} KiB)")
        for line in stat.traceback.format()[-(16 if args.group == "traceback" else 2):]:
            print(f"      {line}")


if __name__ == "__main__":
    main()
