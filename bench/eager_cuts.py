"""Every eager first cut of the segmenter, and what moved against another tree's segmenter.

    python bench/eager_cuts.py                      # list the cuts (default, phrase, words)
    python bench/eager_cuts.py --against /work/main # every reply fed whole through both

A reply's first segment is an eager cut when it is shorter than sentence mode's first
segment. Each is printed with the 40 characters before it and the 30 after, the set, the
reply's line and the config, so that it can be classified by eye (bench/SEGMENTATION.md,
"Eager cuts inside a unit"). ``--against`` feeds every reply of the same sets whole through
this tree's segmenter and the other's in four configurations (sentences only, default,
first_phrase_words=3, first_max_words=4) and prints each reply whose segments differ, in
text or in what is spoken.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {"sentences": {"first_min_words": 0}, "default": {},
           "phrase3": {"first_phrase_words": 3}, "words4": {"first_max_words": 4}}


def replay_sets() -> dict[str, Path]:
    """The corpus, the held-out sets, the project's replay set and the hub's where present."""
    data = ROOT / "tests" / "data"
    sets = {"corpus": data / "segmentation.jsonl"}
    sets |= {p.stem.removeprefix("segmentation-"): p
             for p in sorted(data.glob("segmentation-heldout*.jsonl"))}
    sets["replay-project"] = ROOT / "engines" / "data" / "replies.jsonl"
    hub = Path("/work/shared/data/replay.jsonl")
    if hub.exists():
        sets["replay-hub"] = hub
    return sets


def segmenter_of(tree: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, tree / "gateway/core/segmenter.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def segments(mod: ModuleType, text: str, config: dict[str, int]) -> list[tuple[str, str]]:
    seg = mod.Segmenter(mod.SegmenterConfig(**config))
    return [(s.text, s.spoken) for s in seg.feed(text) + seg.finish()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", type=Path, help="another tree: compare its segmenter")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))  # engines/, not bench/engines.py
    ours = segmenter_of(ROOT, "segmenter_here")
    other = segmenter_of(args.against, "segmenter_other") if args.against else None
    pairs = differ = cuts = 0
    for name, path in replay_sets().items():
        for n, line in enumerate(path.read_text().splitlines()):
            if not line.strip():
                continue
            text = json.loads(line)["reply"]
            if other is not None:
                for cn, config in CONFIGS.items():
                    pairs += 1
                    a, b = segments(other, text, config), segments(ours, text, config)
                    if a != b:
                        differ += 1
                        same_speech = " ".join(s for _, s in a) == " ".join(s for _, s in b)
                        print(f"{name}#{n} {cn}" + ("" if same_speech else " (speech differs)"))
                        print("  other: " + " | ".join(t for t, _ in a))
                        print("  here:  " + " | ".join(t for t, _ in b))
                continue
            base = segments(ours, text, CONFIGS["sentences"])[0][0]
            for cn in ("default", "phrase3", "words4"):
                first = segments(ours, text, CONFIGS[cn])[0][0]
                if len(first) < len(base):
                    cuts += 1
                    end = text.index(first) + len(first)
                    print(f"{name}#{n} {cn}: {text[max(0, end - 40):end]!r} | "
                          f"{text[end:end + 30]!r}")
    print(f"{pairs} pairs, {differ} differ" if other is not None else f"{cuts} eager cuts")


if __name__ == "__main__":
    main()
