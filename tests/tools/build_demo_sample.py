"""Build the demo's bundled sample from the shared development datasets (maintenance script).

Deterministic: the same datasets give the same bytes. Selects conversations from the permissively
licensed sources only (STAR: MIT; MultiWOZ 2.1 via ConvLab-2: MIT/Apache-2.0; tau-bench airline:
MIT), ranks each source's conversations by a hash of their id and takes the first few of suitable
length, strips tau-bench's ``###STOP###`` simulator token, and keeps only the schema fields the
demo needs plus a tiny whitelist of outcome labels from ``meta``.

    python tests/tools/build_demo_sample.py            # write sidecar/tools/demo/data/
    python tests/tools/build_demo_sample.py --out DIR  # write elsewhere (the test compares bytes)

The shared datasets are found at ``$SIDECAR_SHARED_DIR/datasets`` or ``<repo>/../shared/datasets``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
OUT_DIR = REPO / "sidecar" / "tools" / "demo" / "data"
STOP_TOKEN = "###STOP###"
META_WHITELIST = ("completion_level", "completed", "user_reported_task_success", "reward", "success")


MIT_TEXT = """## MIT licence text (STAR, tau-bench, MultiWOZ)

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute,
sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES
OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN
CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.

ConvLab-2's Apache License 2.0 is the same licence as this project's; its text is at
https://www.apache.org/licenses/LICENSE-2.0."""


@dataclass(frozen=True)
class Source:
    folder: str
    name: str
    count: int
    min_turns: int
    max_turns: int


# 300 conversations in all; tau-bench is smaller and its turns much longer (each carries the
# airline policy as a system message), so it gets a smaller share.
SOURCES = (
    Source("star", "STAR", 130, 6, 40),
    Source("multiwoz", "MultiWOZ 2.1 (ConvLab-2 copy)", 120, 6, 30),
    Source("taubench_airline", "tau-bench airline trajectories", 50, 6, 40),
)


@dataclass
class Stats:
    conversations: int = 0
    turns: int = 0
    stop_tokens_stripped: int = 0
    empty_turns_dropped: int = 0
    roles: dict[str, int] = field(default_factory=dict)


def shared_dir() -> Path:
    env = os.environ.get("SIDECAR_SHARED_DIR")
    return Path(env) if env else REPO.parent / "shared"


def _rank(conversation_id: str) -> str:
    return hashlib.sha256(conversation_id.encode("utf-8")).hexdigest()


def _read(path: Path) -> Iterator[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def _clean(rec: dict[str, Any], stats: Stats) -> dict[str, Any]:
    turns = []
    for turn in rec["turns"]:
        content = turn["content"]
        if STOP_TOKEN in content:
            content = content.replace(STOP_TOKEN, "").strip()
            stats.stop_tokens_stripped += 1
            if not content and not turn.get("tool_calls"):
                stats.empty_turns_dropped += 1
                continue
        out: dict[str, Any] = {"role": turn["role"], "content": content}
        if turn.get("tool_calls"):
            out["tool_calls"] = [{"name": c["name"], "arguments": c.get("arguments", "")} for c in turn["tool_calls"]]
        if turn.get("name"):
            out["name"] = turn["name"]
        turns.append(out)
        stats.roles[out["role"]] = stats.roles.get(out["role"], 0) + 1
    meta = {k: rec["meta"][k] for k in META_WHITELIST if k in rec.get("meta", {})}
    stats.conversations += 1
    stats.turns += len(turns)
    return {
        "conversation_id": rec["conversation_id"],
        "source": rec["source"],
        "domain": rec.get("domain", ""),
        "turns": turns,
        "meta": meta,
    }


def _readme_facts(folder: Path) -> dict[str, str]:
    text = (folder / "README.md").read_text(encoding="utf-8")
    facts = {}
    for key, pattern in {
        "repository": r"Source repository: (\S+)",
        "commit": r"Commit: `([0-9a-f]+)`",
        "licence": r"Licence as stated in the repository: \*\*(.+?)\*\*",
        "notice": r"Licence as stated in the repository: \*\*.+?\*\* — (.+)",
        "read_from": r"Read from: (.+)",
    }.items():
        m = re.search(pattern, text)
        facts[key] = m.group(1).strip() if m else "unknown"
    return facts


def build(datasets: Path) -> tuple[bytes, str]:
    """The sample's gzipped bytes and the attribution text."""
    selected: list[dict[str, Any]] = []
    sections = []
    for src in SOURCES:
        folder = datasets / src.folder
        stats = Stats()
        candidates = [r for r in _read(folder / "dev.jsonl.gz") if src.min_turns <= len(r["turns"]) <= src.max_turns]
        candidates.sort(key=lambda r: _rank(r["conversation_id"]))
        for rec in candidates[: src.count]:
            selected.append(_clean(rec, stats))
        facts = _readme_facts(folder)
        changes = [
            f"{stats.conversations} of the folder's development conversations with "
            f"{src.min_turns}-{src.max_turns} turns, chosen by SHA-256 of the conversation id",
            "kept fields: conversation_id, source, domain, turns (role, content, tool_calls, name); "
            f"meta reduced to {', '.join(k for k in META_WHITELIST)} where present",
        ]
        if stats.stop_tokens_stripped:
            changes.append(
                f"removed the simulator's `{STOP_TOKEN}` token from {stats.stop_tokens_stripped} messages "
                f"({stats.empty_turns_dropped} messages that held nothing else were dropped)"
            )
        roles = ", ".join(f"{k}: {v}" for k, v in sorted(stats.roles.items()))
        sections.append(
            "\n".join(
                [
                    f"## {src.name}",
                    "",
                    f"- Repository: {facts['repository']}",
                    f"- Commit: `{facts['commit']}`",
                    f"- Licence: {facts['licence']} ({facts['notice']})",
                    f"- Read from: {facts['read_from']} (via the project's development conversion)",
                    f"- In this sample: {stats.conversations} conversations, {stats.turns} messages ({roles})",
                    "- Changes: " + "; ".join(changes) + ".",
                ]
            )
        )
    selected.sort(key=lambda r: _rank(r["conversation_id"]))
    raw = io.BytesIO()
    # mtime=0 and no file name: the same records give the same bytes.
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
        for rec in selected:
            gz.write(json.dumps(rec, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode())
            gz.write(b"\n")
    attribution = (
        "\n\n".join(
            [
                "# Demo sample: sources and attribution",
                f"`sample.jsonl.gz` holds {len(selected)} task-oriented conversations from public datasets, "
                "for `sidecar demo` only. Each conversation keeps its original text. It is rebuilt "
                "deterministically by `tests/tools/build_demo_sample.py` from the project's development "
                "copies of these datasets. The licences below are those stated in each source repository; "
                "the original copyright notices and licences apply to the text.",
                *sections,
                MIT_TEXT,
            ]
        )
        + "\n"
    )
    return raw.getvalue(), attribution


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--datasets", type=Path, default=None)
    args = parser.parse_args(argv)
    data, attribution = build(args.datasets or shared_dir() / "datasets")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sample.jsonl.gz").write_bytes(data)
    (args.out / "ATTRIBUTION.md").write_text(attribution, encoding="utf-8")
    print(f"wrote {args.out / 'sample.jsonl.gz'} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
