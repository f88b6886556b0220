"""Speech segmentation benchmark: this segmenter against the peers, on the same streams.

    python bench/segmentation.py --setup-peers      # once: peer venvs under /work/peer-venvs
    python bench/segmentation.py [--replies FILE ...] [--draws 10]
    python bench/segmentation.py --sweep            # first_min_words, first_phrase_words,
                                                    # first_max_words

Every splitter gets the same input: the corpus (tests/data/segmentation.jsonl) fed in random
chunk sizes (seeded), and the replay replies streamed like oMLX (51.5 tok/s, 4-9 tokens per
chunk). Peers run in their own venvs through a subprocess (this same file with --run-peer);
a peer whose venv is missing is reported "not installed". Printed per splitter:

* bad: boundaries where the corpus has none (a split inside "8.4", "p.m.", a quote...);
* missed: corpus boundaries the splitter did not make;
* exact: share of (reply, chunking) runs whose segments match the corpus exactly;
* p50/p99 cost of one feed call (µs), over all chunks;
* first: median time from the first token to the first segment on each replay set (the
  project's, engines/data/replies.jsonl, and the hub's examples where present), each reply
  streamed at oMLX's pace in ``--draws`` random chunkings (virtual time: chunk arrival, plus
  the measured cost), and how many times earlier that is than sentence-only splitting (the
  "ours" row). One chunking per reply moved the median by up to 50 ms between seeds.

Boundaries are compared as counts of non-space characters before each segment, so a peer
that strips or reflows whitespace is not penalised; a peer that drops characters (emoji,
links) is aligned with difflib.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VENVS = Path(os.environ.get("PEER_VENVS", "/work/peer-venvs"))
TOK_PER_S = 51.5
PHRASE_WORDS = 3  # first_phrase_words of the "ours-phrase" row (chosen by --sweep)
MAX_WORDS = 4  # first_max_words of the "ours-words" row (chosen by --sweep)

# name -> (venv or None for the project venv, pip packages, note)
SPLITTERS: dict[str, tuple[str | None, list[str], str]] = {
    "ours": (None, [], "gateway.core.segmenter, sentence mode (first_min_words=0)"),
    "ours-eager": (None, [], "gateway.core.segmenter, default config (eager first clause)"),
    "ours-phrase": (None, [], f"gateway.core.segmenter, default config + "
                              f"first_phrase_words={PHRASE_WORDS} (opt-in first phrase)"),
    "ours-words": (None, [], f"gateway.core.segmenter, default config + "
                             f"first_max_words={MAX_WORDS} (opt-in, prosody-blind)"),
    "regex": (None, [], r"naive (?<=[.!?])\s+, emits all but the last piece"),
    "pysbd": ("pysbd", ["pysbd==0.3.4"], "pysbd re-run on the buffer, emits all but the last"),
    "pipecat": ("pipecat", ["pipecat-ai==1.14.0"], "SimpleTextAggregator (sentencex + lookahead)"),
    "livekit-basic": ("livekit", ["livekit-agents==1.8.9", "blingfire==0.1.8"],
                      "tokenize.basic.SentenceTokenizer(min_sentence_len=1).stream()"),
    "livekit-blingfire": ("livekit", ["livekit-agents==1.8.9", "blingfire==0.1.8"],
                          "tokenize.blingfire.SentenceTokenizer(min_sentence_len=1).stream()"),
    "stream2sentence": ("stream2sentence", ["stream2sentence==1.1.0"],
                        "generate_sentences(min lengths 1); latency with its fast first fragment"),
}


# --- splitters (run inside whichever venv has the package) ------------------------------

Split = tuple[list[str], list[int], int | None]
"""A splitter's run: (segments, cost_ns per chunk, chunk of the first segment)."""


def _timed_feed(feed: Callable[[str], list[str]], finish: Callable[[], list[str]],
                chunks: list[str]) -> Split:
    """Drive a feed/finish splitter; returns (segments, cost_ns per chunk, chunk of first)."""
    segs: list[str] = []
    costs: list[int] = []
    first = None
    clock = time.perf_counter_ns
    for n, chunk in enumerate(chunks):
        t0 = clock()
        out = feed(chunk)
        costs.append(clock() - t0)
        if out:
            segs += out
            if first is None:
                first = n
    segs += finish()
    return segs, costs, first


def _ours(chunks, name):
    sys.path.insert(0, str(ROOT))
    from gateway.core.segmenter import Segmenter, SegmenterConfig

    cfg = {"ours": SegmenterConfig(first_min_words=0, max_chars=10_000),
           "ours-eager": SegmenterConfig(),
           "ours-phrase": SegmenterConfig(first_phrase_words=PHRASE_WORDS),
           "ours-words": SegmenterConfig(first_max_words=MAX_WORDS)}[name]
    seg = Segmenter(cfg)
    return _timed_feed(lambda c: [s.text for s in seg.feed(c)],
                       lambda: [s.text for s in seg.finish()], chunks)


def _buffered(split, chunks):
    """Re-split the buffer on each chunk; everything but the last piece is final."""
    buf = [""]

    def feed(c):
        buf[0] += c
        parts = [p for p in split(buf[0]) if p.strip()]
        if len(parts) < 2:
            return []
        last = parts[-1]
        buf[0] = buf[0][buf[0].rfind(last.strip()):] if last.strip() in buf[0] else last
        return [p.strip() for p in parts[:-1]]

    return _timed_feed(feed, lambda: [buf[0].strip()] if buf[0].strip() else [], chunks)


def _regex(chunks):
    pattern = re.compile(r"(?<=[.!?])\s+")
    return _buffered(pattern.split, chunks)


def _pysbd(chunks):
    import pysbd

    seg = pysbd.Segmenter(language="en", clean=False)
    return _buffered(seg.segment, chunks)


def _pipecat(chunks):
    import asyncio

    from pipecat.utils.text.simple_text_aggregator import SimpleTextAggregator

    async def main():
        agg = SimpleTextAggregator()

        async def feed(c):
            return [a.text async for a in agg.aggregate(c)]

        segs, costs, first = [], [], None
        for n, c in enumerate(chunks):
            t0 = time.perf_counter_ns()
            out = await feed(c)
            costs.append(time.perf_counter_ns() - t0)
            if out:
                segs += out
                first = n if first is None else first
        last = await agg.flush()
        if last and last.text.strip():
            segs.append(last.text)
        return segs, costs, first

    return asyncio.run(main())


def _livekit(chunks, kind):
    import asyncio

    if kind == "basic":
        from livekit.agents.tokenize.basic import SentenceTokenizer
    else:
        from livekit.agents.tokenize.blingfire import SentenceTokenizer

    async def main():
        stream = SentenceTokenizer(min_sentence_len=1).stream()
        ch = stream._event_ch

        def drain():
            out = []
            while True:
                try:
                    out.append(ch.recv_nowait().token)
                except Exception:
                    return out

        segs, costs, first = [], [], None
        for n, c in enumerate(chunks):
            t0 = time.perf_counter_ns()
            stream.push_text(c)
            out = drain()
            costs.append(time.perf_counter_ns() - t0)
            if out:
                segs += out
                first = n if first is None else first
        stream.end_input()
        segs += drain()
        return segs, costs, first

    return asyncio.run(main())


def _stream2sentence(chunks: list[str], fast: bool) -> Split:
    from stream2sentence import generate_sentences

    stamps: list[int] = []

    def source() -> Iterator[str]:
        for c in chunks:
            stamps.append(time.perf_counter_ns())
            yield c
        stamps.append(time.perf_counter_ns())

    opts = ({"quick_yield_single_sentence_fragment": True} if fast else
            {"minimum_sentence_length": 1, "minimum_first_fragment_length": 1})
    segs: list[str] = []
    first: int | None = None
    for s in generate_sentences(source(), **opts):
        if first is None:
            first = min(len(stamps), len(chunks)) - 1
        segs.append(s)
    costs = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return segs, costs, first


def _run_one(name, chunks, latency):
    match name:
        case "ours" | "ours-eager" | "ours-phrase" | "ours-words":
            return _ours(chunks, name)
        case "regex":
            return _regex(chunks)
        case "pysbd":
            return _pysbd(chunks)
        case "pipecat":
            return _pipecat(chunks)
        case "livekit-basic" | "livekit-blingfire":
            return _livekit(chunks, name.removeprefix("livekit-"))
        case "stream2sentence":
            return _stream2sentence(chunks, fast=latency)
    raise ValueError(name)


def run_peer(name: str, job_path: str) -> None:
    """Subprocess entry: run one splitter over the job, print JSON results."""
    import logging

    logging.disable(logging.CRITICAL)
    job = json.loads(Path(job_path).read_text())
    out: dict[str, list[dict[str, Any]]] = {"corpus": [], "latency": []}
    for chunks in job["corpus"]:
        # Cost of each chunk: the least over a few runs (the machine is shared; the
        # splitters are deterministic, so the same chunk does the same work each time).
        runs = [_run_one(name, chunks, latency=False) for _ in range(job["repeat"])]
        costs = [min(c) for c in zip(*(r[1] for r in runs), strict=True)]
        out["corpus"].append({"segments": runs[0][0], "costs": costs})
    for chunks in job["latency"]:
        segs, costs, first = _run_one(name, chunks, latency=True)
        out["latency"].append({"first": first, "costs": costs})
    print(json.dumps(out))


# --- the comparison ---------------------------------------------------------------------

def _nonspace(s: str) -> str:
    return re.sub(r"\s+", "", s)


def boundaries(reply: str, segments: list[str]) -> set[int]:
    """Segment starts as counts of non-space reply characters before them (first excluded)."""
    target = _nonspace(reply)
    pieces = [_nonspace(s) for s in segments]
    pieces = [p for p in pieces if p]
    starts, total = [], 0
    for p in pieces:
        starts.append(total)
        total += len(p)
    joined = "".join(pieces)
    if joined != target:  # the peer dropped or changed characters: align
        mapping: dict[int, int] = {}
        sm = difflib.SequenceMatcher(None, joined, target, autojunk=False)
        for a, b, size in sm.get_matching_blocks():
            for d in range(size + 1):
                mapping.setdefault(a + d, b + d)
        starts = [mapping.get(s, mapping[min(mapping, key=lambda k: abs(k - s))])
                  for s in starts]
    return {s for s in starts if 0 < s < len(target)}


_CLAUSE_MARKS = ",;:-\u2013\u2014\uff0c\u3001\uff1b\uff1a"
"""What an eager first segment may end with: ours-eager's intended first cut."""

_CLOSERS = "\"')]\u2019\u201d\u00bb\u300d\u300f"
"""Closing quotes and brackets an eager first segment may end with after its clause mark
(`"Done, the end," | she said.`)."""


def _ends_clause(first: str) -> bool:
    """``first`` (an eager first segment) ends with a clause mark, closers aside."""
    mark = first.rstrip(_CLOSERS)[-1:]
    return bool(mark) and mark in _CLAUSE_MARKS


def _opens_phrase(reply: str, b: int) -> bool:
    """True when the word at non-space offset ``b`` of the reply is a phrase opener that
    first_phrase_words may cut before (its intended cut)."""
    sys.path.insert(0, str(ROOT))
    from gateway.core.segmenter import _PHRASE_OPENERS

    seen = 0
    for i, c in enumerate(reply):
        if seen == b and not c.isspace():
            return i > 0 and reply[i - 1].isspace() and \
                reply[i:].split(maxsplit=1)[0] in _PHRASE_OPENERS
        seen += not c.isspace()
    return False


def _after_words(reply: str, b: int, n: int) -> bool:
    """True when non-space offset ``b`` of the reply starts a word with at least ``n``
    words before it: where first_max_words=n may cut (its intended cut)."""
    seen = 0
    for i, c in enumerate(reply):
        if seen == b and not c.isspace():
            head = reply[:i]
            return head[-1:].isspace() and sum(
                any(ch.isalnum() for ch in w) for w in head.split()) >= n
        seen += not c.isspace()
    return False


_EMOJI_END = re.compile("[\\s\U0001F000-\U0001FFFF\u2600-\u27BF\u2B00-\u2BFF\uFE0F\u200D]+$")
_ENDS = _CLAUSE_MARKS + ".!?\u2026\u3002\uff01\uff1f"


def _mid_phrase(reply: str, first: str) -> bool:
    """``first`` (the reply's first segment) ends in the middle of a line, at no sentence
    end, clause mark or emoji (one ends a sentence before a capital): a cut only a word
    count makes."""
    rest = reply.lstrip()[len(first):]
    return bool(rest.strip()) and not rest.lstrip(" \t").startswith("\n") and (
        _EMOJI_END.search(first) is None and first.rstrip(_CLOSERS)[-1:] not in _ENDS)


def chunk_corpus(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 32)
        out.append(text[i:i + n])
        i += n
    return out


_TOKEN = re.compile(r"\s*[A-Za-z]+|\s*\d|\s*[^\sA-Za-z\d]|\s+")


def chunk_omlx(text: str, rng: random.Random) -> tuple[list[str], list[float]]:
    """Approximate LLM tokens, grouped 4-9 per chunk like oMLX's SSE bursts.

    Returns the chunks and the arrival time (s after the first token) of each."""
    tokens = _TOKEN.findall(text)
    assert "".join(tokens) == text
    chunks, times, i = [], [], 0
    while i < len(tokens):
        n = rng.randint(4, 9)
        chunks.append("".join(tokens[i:i + n]))
        i = min(i + n, len(tokens))
        times.append((i - 1) / TOK_PER_S)
    return chunks, times


def python_for(name: str) -> str | None:
    venv = SPLITTERS[name][0]
    if venv is None:
        return sys.executable
    exe = VENVS / venv / "bin" / "python"
    return str(exe) if exe.exists() else None


def setup_peers() -> None:
    done: set[str] = set()
    for name, (venv, packages, _) in SPLITTERS.items():
        if venv is None or venv in done:
            continue
        done.add(venv)
        path = VENVS / venv
        print(f"{name}: creating {path} with {' '.join(packages)}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        try:
            subprocess.run([str(path / "bin" / "pip"), "install", "-q", *packages],
                           check=True, timeout=600)
        except (subprocess.SubprocessError, OSError) as exc:
            print(f"  failed: {exc}", flush=True)


def _set_name(path: str) -> str:
    """A replay set as the tables name it: its folder and file."""
    return f"{Path(path).parent.name}/{Path(path).name}"


def first_segments(texts: list[str], config, seed: int, draws: int = 1
                   ) -> list[tuple[float, str]]:
    """(ms after the first token, text) of each reply's first segment, streamed like oMLX
    in ``draws`` random chunkings (the replies in order, draw after draw)."""
    sys.path.insert(0, str(ROOT))
    from gateway.core.segmenter import Segmenter

    rng = random.Random(seed)
    firsts = []
    for text in [t for _ in range(draws) for t in texts]:
        chunks, times = chunk_omlx(text, rng)
        seg = Segmenter(config)
        out, at = [], len(chunks) - 1
        for n, c in enumerate(chunks):
            out = seg.feed(c)
            if out:
                at = n
                break
        out = out or seg.finish()
        firsts.append((times[at] * 1000, out[0].text))
    return firsts


def sweep(sets: dict[str, list[str]], seed: int, knob: str, values: tuple[int, ...],
          draws: int) -> None:
    """Median first-segment time and length against one knob (the others at defaults)."""
    sys.path.insert(0, str(ROOT))
    from gateway.core.segmenter import SegmenterConfig

    print(f"| {knob} | " + " | ".join(
        f"{k}: first segment ms (median) | words (median)" for k in sets) + " |")
    print("|---:|" + "---:|---:|" * len(sets))
    for value in values:
        cells = []
        for texts in sets.values():
            firsts = first_segments(texts, SegmenterConfig(**{knob: value}), seed, draws)
            cells.append(f"{statistics.median(ms for ms, _ in firsts):.0f} | "
                         f"{statistics.median(len(t.split()) for _, t in firsts):.0f}")
        print(f"| {value} | " + " | ".join(cells) + " |")
    print()


def sweep_words(sets: dict[str, list[str]], seed: int, values: tuple[int, ...], draws: int,
                show: int, n: int = 10) -> None:
    """first_max_words against sentence-only splitting: median first segment (ms, × earlier)
    and how many first segments it cuts mid-phrase (``_mid_phrase``) on each set; then
    ``n`` of the mid-phrase first segments at ``show`` beside the default's."""
    sys.path.insert(0, str(ROOT))
    from gateway.core.segmenter import SegmenterConfig

    sentences = SegmenterConfig(first_min_words=0, max_chars=10_000)
    base = {k: statistics.median(ms for ms, _ in first_segments(t, sentences, seed, draws))
            for k, t in sets.items()}
    print("| first_max_words | " + " | ".join(
        f"{k}: first segment ms (median) | × earlier than sentences ({base[k]:.0f} ms) | "
        f"replies cut mid-phrase" for k in sets) + " |")
    print("|---:|" + "---:|---:|---:|" * len(sets))
    for value in values:
        cells = []
        for k, texts in sets.items():
            firsts = first_segments(texts, SegmenterConfig(first_max_words=value), seed, draws)
            median = statistics.median(ms for ms, _ in firsts)
            mid = sum(_mid_phrase(r, t) for r, (_, t) in zip(texts * draws, firsts, strict=True))
            cells.append(f"{median:.0f} | {base[k] / median:.2f}× | "
                         f"{mid / draws:g} of {len(texts)}")  # the same in every chunking
        print(f"| {value} | " + " | ".join(cells) + " |")
    print(f"\nfirst_max_words={show}: first segments cut mid-phrase (one chunking per reply)\n")
    print(f"| default | ms | first_max_words={show} | ms |")
    print("|---|---:|---|---:|")
    shown = 0
    for texts in sets.values():
        off = first_segments(texts, SegmenterConfig(), seed)
        on = first_segments(texts, SegmenterConfig(first_max_words=show), seed)
        for reply, (ms0, t0), (ms1, t1) in zip(texts, off, on, strict=True):
            if shown < n and _mid_phrase(reply, t1):
                print(f"| {t0} | {ms0:.0f} | {t1} | {ms1:.0f} |")
                shown += 1
    print()


def show_first_phrases(replies: list[str], seed: int, words: int, n: int = 10) -> None:
    """The first segment of ``n`` replies with first_phrase_words=words beside the default's,
    to judge the prosody: the replies it changes first, then unchanged ones."""
    sys.path.insert(0, str(ROOT))
    from gateway.core.segmenter import SegmenterConfig

    off = first_segments(replies, SegmenterConfig(), seed)
    on = first_segments(replies, SegmenterConfig(first_phrase_words=words), seed)
    pairs = list(zip(off, on, strict=True))
    changed = [(a, b) for a, b in pairs if a[1] != b[1]]
    same = [(a, b) for a, b in pairs if a[1] == b[1]]
    print(f"first_phrase_words={words} changes the first segment of {len(changed)} of "
          f"{len(replies)} replies:\n")
    print(f"| default (first_phrase_words=0) | ms | first_phrase_words={words} | ms |")
    print("|---|---:|---|---:|")
    for (ms0, t0), (ms1, t1) in (changed + same)[:max(n, len(changed))]:
        print(f"| {t0} | {ms0:.0f} | {t1 if t1 != t0 else '(same)'} | {ms1:.0f} |")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(ROOT / "tests/data/segmentation.jsonl"))
    shared = Path("/work/shared/data/replay.jsonl")  # the hub's examples, where present
    ap.add_argument("--replies", nargs="+",
                    default=[str(ROOT / "engines" / "data" / "replies.jsonl")]
                    + ([str(shared)] if shared.exists() else []),
                    help="replay sets: JSONL with a 'reply' field per line (default: the "
                         "project's, and the hub's examples where present)")
    ap.add_argument("--draws", type=int, default=10,
                    help="random oMLX chunkings per replay reply (first-segment times)")
    ap.add_argument("--chunkings", type=int, default=3, help="random chunkings per reply")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=5, help="runs per chunking; least cost kept")
    ap.add_argument("--only", nargs="*",
                    help="splitters to run (default: all); ours, the sentences-only baseline "
                         "of the first-segment ratio, always runs first")
    ap.add_argument("--setup-peers", action="store_true")
    ap.add_argument("--sweep", action="store_true",
                    help="tune first_min_words, first_phrase_words and first_max_words "
                         "(ours only)")
    ap.add_argument("--heldout", default=str(ROOT / "tests/data/segmentation-heldout.jsonl"),
                    help="second corpus for --sweep")
    ap.add_argument("--phrase-words", type=int, default=PHRASE_WORDS,
                    help="first_phrase_words whose first segments --sweep shows")
    ap.add_argument("--max-words", type=int, default=MAX_WORDS,
                    help="first_max_words whose mid-phrase first segments --sweep shows")
    ap.add_argument("--run-peer", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_peer:
        run_peer(args.run_peer, args.job)
        return
    if args.setup_peers:
        setup_peers()
        return

    rng = random.Random(args.seed)
    corpus = [json.loads(line) for line in Path(args.corpus).read_text().splitlines()]
    replay_sets = {path: [json.loads(line)["reply"] for line in Path(path).read_text().splitlines()
                          if line.strip()] for path in args.replies}
    replies = replay_sets[args.replies[0]]
    if args.sweep:
        heldout = [json.loads(line) for line in Path(args.heldout).read_text().splitlines()]
        sets = {f"replay set {_set_name(p)}": t for p, t in replay_sets.items()} | {
                "corpus": [r["reply"] for r in corpus],
                "corpus, first sentence >= 12 words": [
                    r["reply"] for r in corpus if len(r["segments"][0].split()) >= 12],
                "held-out": [r["reply"] for r in heldout]}
        sweep(sets, args.seed, "first_min_words", (0, 2, 3, 4, 5, 6, 8), args.draws)
        sweep(sets, args.seed, "first_phrase_words", (0, 1, 2, 3, 4, 5, 6), args.draws)
        show_first_phrases(replies, args.seed, args.phrase_words)
        sweep_words({f"replay set {_set_name(p)}": t for p, t in replay_sets.items()},
                    args.seed, (0, 3, 4, 5, 6, 7, 8), args.draws, args.max_words)
        return
    runs = [(row, chunk_corpus(row["reply"], rng)) for row in corpus
            for _ in range(args.chunkings)]
    # Each replay set's streams draw from their own generator, seeded as in --sweep
    # (first_segments): the first-segment figures must not move when the corpus grows
    # (sharing the corpus's generator, 10 more corpus replies moved ours-phrase 194 -> 214 ms).
    latency_rngs = {path: random.Random(args.seed) for path in replay_sets}
    latency = [(path, *chunk_omlx(r, latency_rngs[path])) for path, texts in replay_sets.items()
               for _ in range(args.draws) for r in texts]
    job = {"corpus": [c for _, c in runs], "latency": [c for _, c, _ in latency],
           "repeat": args.repeat}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(job, fh)
    n_chunks = sum(len(c) for _, c in runs)
    print(f"corpus: {len(corpus)} replies x {args.chunkings} chunkings ({n_chunks} chunks of "
          f"1-32 chars); first segment: {args.draws} chunkings of each reply at "
          f"{TOK_PER_S} tok/s, 4-9 tokens per chunk, of "
          + ", ".join(f"{len(t)} replies from {p}" for p, t in replay_sets.items()) + "\n")

    rows: list[tuple[str, dict[str, Any] | str | None]] = []  # (None: not installed)
    # "ours" (sentences only) is the baseline of the "× earlier" column: it runs first, always
    names = ["ours", *(n for n in args.only or SPLITTERS if n != "ours")]
    try:
        for name in names:
            exe = python_for(name)
            if exe is None:
                rows.append((name, None))
                continue
            proc = subprocess.run([exe, __file__, "--run-peer", name, "--job", fh.name],
                                  capture_output=True, text=True, cwd=ROOT)
            if proc.returncode != 0:
                print(f"{name}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
                rows.append((name, "failed"))
                continue
            rows.append((name, json.loads(proc.stdout.strip().splitlines()[-1])))
    finally:
        os.unlink(fh.name)

    set_names = [_set_name(p) for p in replay_sets]
    print("| splitter | bad splits | missed | exact lines | p50 µs/chunk | p99 µs/chunk | "
          + " | ".join(f"first segment, {n} (median ms, × earlier than sentences)"
                       for n in set_names) + " |")
    print("|---|---:|---:|---:|---:|---:|" + "---:|" * len(set_names))
    sentence_only: dict[str, float] = {}
    for name, res in rows:
        if not isinstance(res, dict):
            print(f"| {name} | {res or 'not installed'} | | | | |" + " |" * len(set_names))
            continue
        bad = missed = exact = 0
        costs: list[int] = []
        for (row, _), r in zip(runs, res["corpus"], strict=True):
            want = boundaries(row["reply"], row["segments"])
            got = boundaries(row["reply"], r["segments"])
            first = min(got, default=None)
            if name in ("ours-eager", "ours-phrase", "ours-words") and first is not None and (
                    first not in want) and (
                    _ends_clause(_nonspace(row["reply"])[:first])
                    or name == "ours-phrase" and _opens_phrase(row["reply"], first)
                    or name == "ours-words" and _after_words(row["reply"], first, MAX_WORDS)):
                got = got - {first}  # the reply's first cut, an intended early one: not bad
            bad += len(got - want)
            missed += len(want - got)
            exact += got == want
            costs += r["costs"]
        firsts: dict[str, list[float]] = {path: [] for path in replay_sets}
        for (path, chunks, times), r in zip(latency, res["latency"], strict=True):
            n = r["first"] if r["first"] is not None else len(chunks) - 1
            firsts[path].append((times[n] + sum(r["costs"][:n + 1]) / 1e9) * 1000)
        cells = []
        for path, values in firsts.items():
            median = statistics.median(values)
            if name == "ours":
                sentence_only[path] = median
            base = sentence_only.get(path)
            cells.append(f"{median:.0f}" + (f" ({base / median:.2f}×)" if base else ""))
        costs.sort()
        p50 = costs[len(costs) // 2] / 1000
        p99 = costs[int(len(costs) * 0.99)] / 1000
        print(f"| {name} | {bad} | {missed} | {exact / len(runs):.1%} | {p50:.1f} | {p99:.1f} "
              f"| {' | '.join(cells)} |")
    print("\n" + "\n".join(f"* {n}: {SPLITTERS[n][2]}" for n in names))


if __name__ == "__main__":
    main()
