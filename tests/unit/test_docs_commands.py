"""Every ``eventlake ...`` command line in the README and the docs parses with the real CLI parser.

The docs name commands in two forms, and both are checked against ``eventlake.cli.build_parser()`` (parsed
only, never run; no broker, no Spark):

- command lines, in code blocks (``$ `` prompts, ``VAR=value`` prefixes, ``\\`` continuations, pipes and
  trailing comments are handled the way a shell reads them) and in code spans;
- synopses, in code spans: ``[optional parts]``, ``a|b`` alternatives (``\\|`` inside a Markdown table),
  ``NAME...`` and placeholders (``N``, ``NAME``, ``<what up prints>``). Each synopsis is expanded into the
  command lines it stands for, and a placeholder given to an option or argument with a type or choices is
  replaced by a value of that type (the first choice), so ``--accounts N`` parses while ``--acounts N`` or a
  verb that does not exist fails.

Besides parsing, every ``--flag`` before a bare ``--`` must be spelled out in full (argparse would accept an
abbreviation). A line whose verb ends with ``:`` is a command's output (``eventlake rollback: ...``), not a
command. The README must also stay a ten-minute read: at most 300 lines.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import re
import shlex
from pathlib import Path

import pytest

from eventlake.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 300

# Where a command starts: an optional prompt, VAR=value prefixes, the entry point (optionally by its path).
_COMMAND_START = re.compile(r"^(?:\$\s+)?(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:\.venv/bin/|\S*/)?eventlake\s+\S")
_PLACEHOLDER = re.compile(r"^(?:<[^>]+>|[A-Z][A-Z0-9_]*(?:[/=][A-Z0-9_]+)*)$")
_MAX_VARIANTS = 512


def doc_files() -> list[Path]:
    """The README, every page of docs/ and bench/README.md, as they are in the working tree now."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
    return [f for f in files if f.exists()]


def _code_blocks_and_spans(text: str) -> tuple[list[tuple[int, str, bool]], list[tuple[int, str]]]:
    """(line number, logical line, whether its block uses `$ ` prompts) of every code-block line (continuations
    joined), and (line number, text) of every inline code span. In a block with prompts, the other lines are
    output."""
    block_lines: list[tuple[int, str, bool]] = []
    prose: list[tuple[int, str]] = []
    block: list[tuple[int, str]] | None = None
    pending, pending_no = "", 0
    for no, line in enumerate(text.split("\n"), start=1):
        if line.lstrip().startswith("```"):
            if block is None:
                block = []
            else:
                prompted = any(ln.startswith("$ ") for _, ln in block)
                block_lines.extend((n, ln, prompted) for n, ln in block)
                block = None
            continue
        if block is not None:
            if pending:
                line, no = pending + " " + line.strip(), pending_no
            if line.rstrip().endswith("\\"):
                pending, pending_no = line.rstrip()[:-1], no
                continue
            pending = ""
            block.append((no, line.strip()))
        else:
            prose.append((no, line))
    spans: list[tuple[int, str]] = []
    # Spans may cross a line break (a long synopsis wrapped in a paragraph): join the paragraph, keep the first
    # line's number for the message.
    joined = ""
    starts: list[tuple[int, int]] = []
    for no, line in prose:
        starts.append((len(joined), no))
        joined += line + "\n"
    for m in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", joined, flags=re.S):
        at = max(n for offset, n in starts if offset <= m.start())
        spans.append((at, " ".join(m.group(2).split())))
    return block_lines, spans


def _shell_segments(line: str) -> list[list[str]]:
    """The simple commands of a shell line, as tokens: split on unquoted | ; && || and redirections, comments
    dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    segments: list[list[str]] = []
    current: list[str] | None = []
    try:
        for token in lexer:
            if token and set(token) <= set(";&|<>"):
                if current:
                    segments.append(current)
                # after a redirection comes its target, then nothing of interest
                current = None if (">" in token or "<" in token) else []
            elif current is not None:
                current.append(token)
    except ValueError:  # an unbalanced quote: an output line, not a command
        return []
    if current:
        segments.append(current)
    return segments


def _after_prefix(tokens: list[str]) -> list[str] | None:
    """The arguments after ``eventlake`` (prompt and VAR=value prefixes dropped), or None if not a command."""
    i = 0
    if tokens and tokens[0] == "$":
        i = 1
    while i < len(tokens) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[i]):
        i += 1
    if i >= len(tokens) or not re.match(r"^(?:\S*/)?eventlake$", tokens[i]):
        return None
    rest = tokens[i + 1:]
    if not rest or rest[0].endswith(":"):  # `eventlake rollback: ...` is output
        return None
    return rest


def commands_in(path: Path) -> list[tuple[str, int, str, list[list[str]]]]:
    """(file, line, the text, the command lines it stands for as arguments after `eventlake`) for every
    eventlake command the file names."""
    text = path.read_text(encoding="utf-8")
    name = str(path.relative_to(ROOT))
    found = []
    blocks, spans = _code_blocks_and_spans(text)
    blocks = [(no, line) for no, line, prompted in blocks if line.startswith("$ ") or not prompted]
    # A shell variable set in a block (K8S="--master ...") is expanded in the lines that use it.
    variables = dict(re.findall(r'^([A-Z][A-Z0-9_]*)="([^"]*)"$', "\n".join(ln for _, ln in blocks), flags=re.M))
    for no, line in blocks:
        line = re.sub(r"\$([A-Z][A-Z0-9_]*)", lambda m: variables.get(m.group(1), m.group(0)), line)
        for tokens in _shell_segments(line):
            args = _after_prefix(tokens)
            if args is not None:
                found.append((name, no, line, [args]))
    for no, span in spans:
        span = span.replace("\\|", "|")
        span = re.sub(r"<([^<>]*)>", lambda m: "<" + m.group(1).replace(" ", "_") + ">", span)
        if _COMMAND_START.match(span):
            found.append((name, no, span, expand_synopsis(span)))
        elif re.search(r"\|\s*(?:\S*/)?eventlake\s", span):  # `echo '{...}' | eventlake submit -`
            for tokens in _shell_segments(span):
                args = _after_prefix(tokens)
                if args is not None:
                    found.append((name, no, span, [args]))
    return found


# -- synopses ---------------------------------------------------------------------------------------------------

def _synopsis_tokens(text: str) -> list[str]:
    """Tokens of a synopsis, with [ ] and a spaced | as tokens of their own; quoted words kept whole."""
    text = re.sub(r"(\[|\])", r" \1 ", text)
    try:
        tokens = shlex.split(text, posix=True)
    except ValueError:
        tokens = text.split()
    return [t[:-3] if t.endswith("...") and len(t) > 3 else t for t in tokens]


def _alternatives(tokens: list[str]) -> list[list[list[str]]]:
    """A sequence of items; each item is a list of alternatives, each alternative a token list (nested [ ])."""
    def parse(i: int, closing: bool):
        alts, seq = [], []
        while i < len(tokens):
            t = tokens[i]
            if t == "[":
                inner, i = parse(i + 1, True)
                seq.append(("opt", inner))
                continue
            if t == "]" and closing:
                alts.append(seq)
                return alts, i + 1
            if t == "|":
                alts.append(seq)
                seq = []
            elif "|" in t and not t.startswith("-") and "=" not in t:
                seq.append(("alt", t.split("|")))
            else:
                seq.append(("tok", t))
            i += 1
        alts.append(seq)
        return alts, i
    alts, _ = parse(0, False)
    return alts


def _expand_seq(seq) -> list[list[str]]:
    choices: list[list[list[str]]] = []
    for kind, value in seq:
        if kind == "tok":
            choices.append([[value]])
        elif kind == "alt":
            choices.append([[v] for v in value if v])
        else:  # optional group: left out, or any of its alternatives
            inner = [[]]
            for alt in value:
                inner.extend(_expand_seq(alt))
            choices.append(inner)
    out = []
    for combo in itertools.product(*choices):
        out.append([t for part in combo for t in part])
        if len(out) >= _MAX_VARIANTS:
            break
    return out


def expand_synopsis(text: str) -> list[list[str]]:
    """The command lines (arguments after `eventlake`) a synopsis stands for."""
    tokens = _synopsis_tokens(text)
    top = _alternatives(tokens)
    first = _expand_seq(top[0]) if top else []
    lines = list(first)
    if len(top) > 1 and first:
        # `eventlake kafka up [--brokers 3] | down | status`: a later alternative repeats the start to the verb.
        prefix = _after_prefix(first[0]) or []
        start = first[0][: len(first[0]) - len(prefix) + 1]
        for alt in top[1:]:
            for line in _expand_seq(alt):
                lines.append(line if _after_prefix(line) is not None else start + line)
    return [rest for rest in (_after_prefix(line) for line in lines) if rest is not None]


# -- parsing ----------------------------------------------------------------------------------------------------

def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of a parser and of its sub-commands' parsers (`eventlake x y --flag`)."""
    known = {s for a in parser._actions for s in a.option_strings}
    for sub in _subparsers(parser).values():
        known |= _option_strings(sub)
    return known


def _sample(action: argparse.Action) -> str | None:
    if action.choices:
        return str(list(action.choices)[0])
    if action.type is int:
        return "1"
    if action.type is float:
        return "1.0"
    return None


def fill_placeholders(args: list[str], sub: argparse.ArgumentParser) -> list[str]:
    """Replace a placeholder with a value of its option's or argument's type (or its first choice)."""
    options = {s: a for a in sub._actions for s in a.option_strings}
    positionals = [a for a in sub._actions if not a.option_strings]
    out, i, slot = [], 0, 0
    while i < len(args):
        token = args[i]
        if token == "--":
            out.extend(args[i:])
            break
        flag = token.split("=", 1)[0]
        if flag in options:
            action = options[flag]
            out.append(token)
            if "=" not in token and action.nargs is None and i + 1 < len(args):
                value = args[i + 1]
                if _PLACEHOLDER.match(value) and _sample(action) is not None:
                    value = _sample(action)
                out.append(value)
                i += 1
        elif not token.startswith("-") and slot < len(positionals):
            action = positionals[slot]
            if action.nargs in (None, 1):
                slot += 1
            if action.nargs == argparse.REMAINDER:
                out.extend(args[i:])
                break
            sample = _sample(action)
            out.append(sample if (_PLACEHOLDER.match(token) and sample is not None) else token)
        else:
            out.append(token)
        i += 1
    return out


def parse_error(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """None when `eventlake ARGS` parses and names only flags that exist in full; else what is wrong."""
    subs = _subparsers(parser)
    if args in (["-h"], ["--help"]):
        return None
    if not args or args[0] not in subs:
        return f"no such command: {args[0] if args else '(none)'} (commands: {', '.join(sorted(subs))})"
    sub = subs[args[0]]
    known = _option_strings(sub)
    positionals = [a for a in sub._actions if not a.option_strings]
    for token in args[1:]:
        if token == "--":
            break
        if positionals and positionals[0].nargs == argparse.REMAINDER and not token.startswith("-"):
            break  # `eventlake airflow dags test ...`: the rest is another program's
        if re.match(r"^--[A-Za-z]", token) and token.split("=", 1)[0] not in known:
            return f"{args[0]}: no such option {token.split('=', 1)[0]}"
    if len(args) == 1:
        return None  # `eventlake query` names the verb in a sentence; its arguments are not the point there
    args = [args[0], *fill_placeholders(args[1:], sub)]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as e:
        if e.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {e.code}"
    return None


def _all_commands():
    return [c for f in doc_files() for c in commands_in(f)]


def test_the_docs_name_eventlake_commands():
    """The scanner finds the commands it is meant to check (a scanner that finds nothing checks nothing)."""
    found = _all_commands()
    verbs = {variant[0] for *_, variants in found for variant in variants if variant}
    assert len(found) > 50
    assert {"demo", "query", "rebuild", "spark-submit", "sql-server", "kafka"} <= verbs


def test_every_eventlake_command_in_the_docs_parses():
    parser = build_parser()
    failures = []
    for name, no, text, variants in _all_commands():
        for args in variants:
            problem = parse_error(parser, args)
            if problem:
                failures.append(f"{name}:{no}: `{text}` -> eventlake {shlex.join(args)}: {problem}")
                break
    assert not failures, "doc lines naming commands the CLI does not parse:\n" + "\n".join(failures)


# A page another change is writing at the same time; linked already, checked as soon as it exists.
_PAGES_BEING_WRITTEN = {"docs/sql-security.md"}


def _slugs(path: Path) -> set[str]:
    """The anchors GitHub makes of a Markdown file's headings (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    in_block = False
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.lstrip().startswith("```"):
            in_block = not in_block
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if in_block or not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_the_docs_links_resolve():
    """Every relative link of the README, docs/ and bench/README.md names a file that exists, and a heading
    of it when it has an #anchor (a section moved or renamed breaks the link, and this test)."""
    broken = []
    for doc in doc_files():
        text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            path = (doc.parent / file_part).resolve() if file_part else doc
            name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
            if not path.exists():
                if name not in _PAGES_BEING_WRITTEN:
                    broken.append(f"{doc.relative_to(ROOT)}: ({target}): no such file")
                continue
            if anchor and path.suffix == ".md" and anchor not in _slugs(path):
                broken.append(f"{doc.relative_to(ROOT)}: ({target}): no heading #{anchor} in {name}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_stays_a_ten_minute_read():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}); move detail to docs/"


@pytest.mark.parametrize("line, ok", [
    ("eventlake kafka up\\|down\\|status [--brokers 3]", True),
    ("eventlake generate --domain accounts|iot|site [--devices N --minutes N]", True),
    ("eventlake spark-submit APP [--master URL] [--deploy-mode client|cluster] [-- ARGS]", True),
    ("eventlake rebuild NAME... [--dry-run]", True),
    ("eventlake yarn up | down | status", True),
    ("eventlake kafka up | down | restart", False),   # a positional choice that does not exist
    ("eventlake rebuild NAME --dryrun", False),        # a misspelt flag
    ("eventlake rebuild NAME --dry", False),           # an abbreviation argparse would take
    ("eventlake frobnicate", False),                   # a verb that does not exist
    ("eventlake history NAME --generation two", False),  # a value of the wrong type
])
def test_the_checker_itself(line, ok):
    parser = build_parser()
    problems = [parse_error(parser, args) for args in expand_synopsis(line.replace("\\|", "|"))]
    assert problems
    assert (not any(problems)) is ok, problems
