"""The segmentation benchmark (bench/segmentation.py) runs and measures what it claims."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

from bench import segmentation as bench
from gateway.core.segmenter import SegmenterConfig

ROOT = Path(__file__).resolve().parent.parent
REPLIES = ROOT / "engines" / "data" / "replies.jsonl"


def test_omlx_chunks_rebuild_the_reply_and_arrive_at_the_token_pace() -> None:
    text = "It's on Tuesday at 3:30 p.m. with Dr. Okafor, at 418 Harbor St. Suite 2."
    chunks, times = bench.chunk_omlx(text, random.Random(1))
    assert "".join(chunks) == text
    assert times == sorted(times) and times[0] >= 3 / bench.TOK_PER_S  # >= 4 tokens first


def test_first_segments_draws_each_reply_several_times() -> None:
    texts = ["Yes! The build is green.", "It's 14 degrees, overcast and windy outside today."]
    got = bench.first_segments(texts, SegmenterConfig(), seed=0, draws=3)
    assert [t for _, t in got] == ["Yes!", "It's 14 degrees, overcast and windy outside today."] * 3
    sentences = bench.first_segments(texts, SegmenterConfig(first_min_words=0), seed=0)
    assert len(sentences) == 2


def test_the_comparison_prints_a_first_segment_column_per_replay_set(tmp_path: Path) -> None:
    hub = tmp_path / "hub.jsonl"
    hub.write_text('{"reply": "Done. I set a reminder for Thursday at 2 p.m. sharp."}\n')
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "segmentation.py"), "--only", "ours",
         "ours-eager", "--chunkings", "1", "--repeat", "1", "--draws", "2",
         "--replies", str(REPLIES), str(hub)],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=True).stdout
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1]
            for line in out.splitlines() if line.startswith("| ours")}
    assert set(rows) == {"ours", "ours-eager"}
    project, examples = rows["ours-eager"][-2:]
    assert project.strip().endswith("×)") and examples.strip().endswith("×)")
    assert rows["ours"][-1].strip().endswith("(1.00×)")
    assert rows["ours"][0].strip() == "0"  # no bad split on the corpus


def test_ours_words_intended_first_cut_and_mid_phrase_count() -> None:
    """ours-words' first cut after MAX_WORDS words at a space is its intended one, and the
    sweep counts a first segment ending mid-line at no mark as cut mid-phrase."""
    reply = "The home team won 3 to 2 in overtime. Great game."
    nonspace = len(bench._nonspace("The home team won"))
    assert bench._after_words(reply, nonspace, 4)
    assert not bench._after_words(reply, nonspace, 5)
    assert not bench._after_words(reply, nonspace - 1, 3)  # inside "won"
    assert bench._mid_phrase(reply, "The home team won")
    assert not bench._mid_phrase(reply, "The home team won 3 to 2 in overtime.")
    assert not bench._mid_phrase("Done 🎉 Great. More.", "Done 🎉")
    assert not bench._mid_phrase("Well done! 🎉 More.", "Well done! 🎉")
    assert not bench._mid_phrase("Sure, go ahead.", "Sure,")
    assert not bench._mid_phrase("A list item\nnext", "A list item")


def test_the_readme_counts_the_corpus_the_bench_feeds() -> None:
    """The README's Segmentation paragraph said 286 replies (33 in the five European
    languages) after two more had joined the corpus, while the bench it names printed
    "corpus: 288 replies": its figures are of the corpus as it is."""
    import json
    import re
    from collections import Counter

    corpus = [json.loads(line) for line in
              (ROOT / "tests" / "data" / "segmentation.jsonl").read_text().splitlines()]
    tags = Counter(row["tag"] for row in corpus)
    readme = " ".join((ROOT / "README.md").read_text().split())
    said = re.search(r"segmentation\.py` \(`--setup-peers` once\); (\d+) replies fed in random "
                     r"chunks \((\d+) of them Chinese and Japanese, (\d+) German, French, "
                     r"Spanish, Italian and Portuguese\)", readme)
    assert said, "the README's Segmentation paragraph no longer counts the corpus"
    european = tags["German, French, Spanish, Italian, Portuguese"]
    assert [int(n) for n in said.groups()] == [len(corpus), tags["Chinese and Japanese"],
                                                european]
    assert f"The {european} German, French, Spanish, Italian and Portuguese replies" in readme
