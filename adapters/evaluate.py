"""``adapters eval``: the paper's protocol (Section 5.2, Table 2) through a real vLLM server.

For every held-out example the prompt is ids(render(c)) (segment-wise, left-truncated to the
adapter's context), exactly what the sidecar sends. A method predicts "complete" iff the greedy
next token is the end tag (the paper's rule); P(end) is read exactly and gives the ROC-AUC.

Methods: the adapter; the same adapter trained without the end tag; the base model alone; and a
supervised classifier trained with the labels (ceiling reference). Because the two ablations can
never emit the end tag by construction, they are also scored with the tag-free rule "complete iff
the greedy next token does not open a new TURN block" (``*_turn_rule``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import structlog
from tqdm import tqdm

from adapters.baseline import tail_text, train_classifier
from adapters.data import messages_from_json, stable_unit
from adapters.manifest import file_sha256, write_manifest
from adapters.metrics import binary_metrics
from adapters.report import write_report
from adapters.tokenizer import END_TAG, encode_messages, encode_plain, load_tokenizer, special_id
from adapters.vllm_server import NextToken, VllmServer, next_token

log = structlog.get_logger()

LABEL_SETS = (("protocol", "test.jsonl"), ("real", "test_real.jsonl"))


def load_examples(path: Path, limit: int | None) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = [json.loads(line) for line in path.read_text().split("\n") if line.strip()]
    if limit is None:
        return out
    # Label-blind subset; a conversation's full and truncated copies stay together (stable sort).
    return sorted(out, key=lambda e: stable_unit(e["conversation_id"], "eval-subset"))[:limit]


def score_model(client: httpx.Client, model: str, prompts: Sequence[list[int]], want: list[int],
                desc: str, *, vocab_size: int) -> list[NextToken]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(tqdm(pool.map(lambda p: next_token(client, model, p, want, full_logprobs=vocab_size), prompts),
                         total=len(prompts), desc=desc, unit="req", leave=False))


def run_eval(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    tok = load_tokenizer(args.base)
    end_id = special_id(tok, END_TAG)
    turn_id = encode_plain(tok, "TURN 1, STEP 1, user chat:\n")[0]
    models = {"adapter": "completion", "base_only": "base"}
    loras = {"completion": args.adapter}
    if args.adapter_no_end_tag is not None:
        models["no_end_tag"] = "completion_noend"
        loras["completion_noend"] = args.adapter_no_end_tag
    clf, clf_n = train_classifier(args.data, args.datasets, seed=0)
    results: dict[str, Any] = {}
    hist: dict[str, dict[str, list[float]]] = {}
    out_dir: Path = args.out
    vocab_size = int(json.loads((args.base / "config.json").read_text())["vocab_size"])
    # Full-vocabulary logprobs make the fallback lookup exact and batch-safe (see next_token).
    server = VllmServer(args.base, loras, out_dir / "vllm.log", port=args.port, max_logprobs=vocab_size)
    with server, httpx.Client(base_url=server.base_url, timeout=120.0) as client:
        for name in args.datasets:
            for set_name, fname in LABEL_SETS:
                exs = load_examples(args.data / name / fname, args.max_examples)
                if not exs:
                    continue
                msgs = [messages_from_json(e["messages"]) for e in exs]
                prompts = [encode_messages(tok, m)[-args.max_context_tokens:] for m in msgs]
                labels = [bool(e["complete"]) for e in exs]
                res: dict[str, Any] = {"label_source": exs[0]["label_source"]}
                lookups = 0
                for method, served in models.items():
                    outs = score_model(client, served, prompts, [end_id, turn_id], f"{name}/{set_name}/{method}",
                                       vocab_size=vocab_size)
                    lookups += sum(o.exact_lookups for o in outs)
                    p_end = [o.probs[end_id] for o in outs]
                    res[method] = binary_metrics(labels, [o.greedy_id == end_id for o in outs], p_end)
                    if method != "adapter":
                        res[f"{method}_turn_rule"] = binary_metrics(
                            labels, [o.greedy_id != turn_id for o in outs], [1 - o.probs[turn_id] for o in outs])
                    if method == "adapter":
                        hist[f"{name}/{set_name}"] = {
                            "complete": [p for p, y in zip(p_end, labels, strict=True) if y],
                            "incomplete": [p for p, y in zip(p_end, labels, strict=True) if not y]}
                proba = clf.predict_proba([tail_text(m) for m in msgs])[:, 1]
                res["supervised_classifier"] = binary_metrics(labels, [p >= 0.5 for p in proba], list(proba))
                res["exact_lookups"] = lookups
                results.setdefault(name, {})[set_name] = res
                log.info("adapters.eval.done", dataset=name, set=set_name,
                         f1_complete=res["adapter"]["complete"]["f1"])
    wall = round(time.monotonic() - t0, 1)
    command = args.command_line or "adapters " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    meta = {"command": command, "wall_seconds": wall, "max_context_tokens": args.max_context_tokens,
            "end_tag_id": end_id, "turn_token_id": turn_id, "classifier_train_examples": clf_n,
            "adapter_sha256": file_sha256(args.adapter / "adapter_model.safetensors"),
            "base_sha256": file_sha256(args.base / "model.safetensors"),
            "prepared_manifest_sha256": file_sha256(args.data / "manifest.json")}
    write_report(out_dir, results, hist, meta)
    write_manifest(out_dir, "evaluation-report", **meta)
    return {"wall_seconds": wall, "f1_complete": {d: {s: r[s]["adapter"]["complete"]["f1"] for s in r}
                                                  for d, r in results.items()}}
