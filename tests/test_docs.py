"""The commands and snippets the README and the docs give an operator run as written: each
``python bench/...``, ``python -m bench...`` and ``python examples/...`` line is taken by its
script's own options, and each Python snippet compiles."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", "protocol.md", *sorted(p.relative_to(ROOT).as_posix()
                                           for p in (ROOT / "docs").glob("*.md")),
        *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "bench").glob("*.md"))]
PLACEHOLDER = re.compile(r"^\[|^<|\.\.\.|\||^[A-Z]+$")
"""A word that stands for what the reader fills in (``[--corpus ...]``, ``<a worktree>``,
``idle|stream``, ``--seed S``): such a command is a pattern, not one to run."""

PARSE_ONLY = """
import argparse, runpy, sys

class Parsed(Exception):
    pass

def parse_args(self, args=None, namespace=None):
    parse_args.original(self, args, namespace)
    raise Parsed

parse_args.original = argparse.ArgumentParser.parse_args
argparse.ArgumentParser.parse_args = parse_args
failed = []
for line in sys.stdin.read().splitlines():
    argv = line.split()
    sys.argv = argv[1:] if argv[0] == "-m" else argv
    try:
        if argv[0] == "-m":
            # (as `python -m` finds it: not imported yet. An earlier command may have
            # imported it, bench.scheduler_variants imports bench.scheduler, and runpy then
            # warns that it "may result in unpredictable behaviour")
            sys.modules.pop(argv[1], None)
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(argv[0], run_name="__main__")
        failed.append(f"{line}: parsed no options")
    except Parsed:
        pass
    except SystemExit as exc:  # argparse's error: an option the script does not take
        failed.append(f"{line}: exit {exc.code}")
print("\\n".join(failed))
"""


def documented_commands() -> dict[str, str]:
    """Each ``python`` command of the docs (code blocks, indented blocks, inline code), with
    its continuation lines joined and its comment dropped → the file that gives it."""
    found: dict[str, str] = {}
    for name in DOCS:
        text = (ROOT / name).read_text()
        lines = re.sub(r"\\\n\s*", " ", text).splitlines()
        candidates = [line.strip() for line in lines if line.strip().startswith("python ")]
        candidates += re.findall(r"`(python [^`]+)`", " ".join(text.split()))
        for command in candidates:
            command = re.sub(r"\s+#.*", "", command).strip()
            words = command.split()[1:]
            if (words and (words[0] == "-m" or words[0].endswith(".py"))
                    and not any(PLACEHOLDER.search(w) for w in words)):
                found.setdefault(" ".join(words), name)
    return found


def test_every_documented_bench_and_example_command_parses() -> None:
    """A flag renamed in a script and not in the doc that gives its command (or the other
    way round) sends the operator an argparse error: each documented command's options are
    parsed by the script itself (nothing else runs: it stops once they are)."""
    commands = documented_commands()
    scripts = {c.split()[1] if c.startswith("-m ") else c.split()[0] for c in commands}
    assert {"bench/segmentation.py", "bench/capacity.py", "bench/http_speech.py",
            "bench/watch_bytes.py", "bench.scheduler", "bench.gc_pause",
            "examples/watch_relay.py"} <= scripts  # (the extraction still finds them)
    out = subprocess.run([sys.executable, "-c", PARSE_ONLY], input="\n".join(commands),
                         capture_output=True, text=True, cwd=ROOT, timeout=240, check=True)
    failed = out.stdout.strip().splitlines()
    assert failed == [], {line: commands.get(line.split(":")[0]) for line in failed}
    assert "Warning" not in out.stderr, out.stderr  # (runpy's, of a module run twice)


def test_the_python_snippets_of_the_readme_and_the_http_api_compile() -> None:
    for name in ("README.md", "docs/http-api.md"):
        snippets = re.findall(r"```python\n(.*?)```", (ROOT / name).read_text(), re.S)
        assert snippets, name
        for snippet in snippets:
            compile(snippet, name, "exec")


def test_every_example_config_loads() -> None:
    """An example TOML is what an operator copies: a key renamed or a bound tightened in
    gateway/config.py must not leave one that stops the gateway at start-up
    (tests/test_cli.py holds what hub.toml configures)."""
    from gateway.config import load_config

    examples = sorted((ROOT / "examples").glob("*.toml"))
    assert examples
    for path in examples:
        load_config(path)


def test_each_example_says_in_its_help_where_it_looks_for_the_gateway() -> None:
    """The README's commands for the examples run them with no --url; their --help listed
    --url (--upstream) without a word, so where they connect, and the relay where it
    listens, was only in the docs. phone_client's said neither that it reads typed lines
    when given no transcript (and a line typed while a reply plays barges in), nor what
    --voice, --instructions and --frame-ms take."""
    for script, said in (("examples/phone_client.py", ["(default ws://127.0.0.1:8780/v1/voice)",
                                                       "pip install sounddevice",
                                                       "saves its audio as turn-NNN.wav",
                                                       "none (and no --file): type them",
                                                       "barges in", "(default 5)",
                                                       "GET /v1/audio/voices", "20, 40, 60"]),
                         ("examples/loadgen.py", ["(default ws://127.0.0.1:8780/v1/voice;",
                                                  "(default 4)", "(default 3)",
                                                  "(exponential; default 0: at once)",
                                                  "think times (default 1)", "(default 90)",
                                                  "pip install matplotlib"]),
                         ("examples/watch_relay.py", ["(default ws://127.0.0.1:8780/v1/voice)",
                                                      "(default 127.0.0.1)", "(default 8790)",
                                                      "(24000–32000; default 24000)"])):
        out = subprocess.run([sys.executable, script, "--help"], capture_output=True,
                             text=True, cwd=ROOT, timeout=120, check=True,
                             env={**os.environ, "COLUMNS": "200"})
        for words in said:
            assert words in out.stdout, (script, words)
