"""``adapters onboard``: an agent's own unlabelled conversations -> a served, routed, calibrated adapter.

Steps, each writing its output and ``steps/<step>.json`` (its result and a fingerprint of
everything it depends on); a rerun skips a step whose fingerprint is unchanged, so an interrupted
onboarding resumes where it stopped (training itself resumes from its checkpoint):

1. ``collect``: read every source, clean, drop conversations without a user message, de-duplicate
   by id (the training store is at-least-once), keep the most recent ``max_conversations``.
2. ``split``: hold back a slice (by a stable hash of the conversation's split group) for
   validation; the rest, plus optional general conversations (``mix``), is the training data.
3. ``train``: LoRA SFT continuing the bundled (or a given) adapter, or a fresh one on a given base,
   with the adapter's own recipe (``adapters.training.lora``).
4. ``validate``: the truncation protocol on the held-back slice, label-free, for the adapter before
   and after; both completion rules and a calibrated P(end) threshold (``adapters.evaluation.calibrate``).
5. ``export``: a clean adapter directory for vLLM, its manifest carrying the validation.
6. ``serve`` and 7. ``route``: ``adapters.serving.serving`` (runtime load or restart command; config).
8. ``report``: ``adapters.onboarding.report`` (markdown, JSON, plot).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog
from tqdm import tqdm

from adapters.data.conversations import (
    Conversation,
    eval_examples,
    messages_from_json,
    stable_unit,
    target_start,
)
from adapters.data.sources import open_source, source_limits
from adapters.errors import DataError
from adapters.evaluation.calibrate import Objective, ScoredExample, calibrate
from adapters.serving.manifest import read_manifest, write_manifest
from adapters.training.recipe import LoraRecipe
from sidecar.transcript.dataset import message_json

log = structlog.get_logger()

STEPS = ("collect", "split", "train", "validate", "export", "serve", "route", "report")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
MIX_NAME = "_general"


@dataclass(frozen=True)
class OnboardSpec:
    """Everything one onboarding depends on (recorded in its manifest)."""

    agent: str
    sources: tuple[str, ...]
    out: Path
    base: Path = ARTIFACTS / "base"
    init_adapter: Path | None = ARTIFACTS / "completion"
    recipe: LoraRecipe = field(default_factory=LoraRecipe)
    min_steps: int = 40
    mix: tuple[str, ...] = ()
    mix_ratio: float = 1.0
    max_conversations: int = 5000
    min_conversations: int = 20
    holdback_fraction: float = 0.2
    min_holdback: int = 10
    objective: Objective = "balanced_accuracy"
    folds: int = 5
    rule: str = "auto"  # auto | greedy | threshold
    min_validation_f1: float = 0.8
    served_name: str | None = None
    base_model_name: str = "base"
    vllm_url: str | None = None
    served_path: Path | None = None
    config: Path | None = None
    sidecar_config: Path | None = None
    max_input_bytes: int = 4 * 1024**3
    seed: int = 0

    def fingerprint_fields(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


class Steps:
    """Runs named steps once per fingerprint; records results and timings."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.dir = out / "steps"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.results: dict[str, dict[str, Any]] = {}
        self.timings: dict[str, dict[str, Any]] = {}
        self._chain = ""

    def run(self, name: str, inputs: dict[str, Any], fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        fp = hashlib.sha256(json.dumps([self._chain, name, inputs], sort_keys=True, default=str).encode()).hexdigest()
        self._chain = fp
        path = self.dir / f"{name}.json"
        if path.exists():
            done = json.loads(path.read_text())
            if done.get("fingerprint") == fp:
                log.info("adapters.onboard.step_skipped", step=name)
                result: dict[str, Any] = done["result"]
                self.results[name] = result
                self.timings[name] = {"seconds": done["seconds"], "skipped": True}
                return result
        t0 = time.monotonic()
        result = fn()
        seconds = round(time.monotonic() - t0, 2)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"fingerprint": fp, "seconds": seconds, "result": result}, indent=2, default=str))
        tmp.replace(path)
        self.results[name] = result
        self.timings[name] = {"seconds": seconds, "skipped": False}
        log.info("adapters.onboard.step_done", step=name, seconds=seconds)
        return result

    def fingerprint(self) -> str:
        return self._chain


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    tmp.replace(path)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _conv_json(c: Conversation) -> dict[str, Any]:
    return {
        "conversation_id": c.conversation_id,
        "split_group": c.split_group,
        "messages": [message_json(m) for m in c.messages],
    }


def collect(spec: OnboardSpec, specs: tuple[str, ...], *, cap: int, dest: Path) -> dict[str, Any]:
    """Read, clean, de-duplicate and keep the newest ``cap`` conversations with a user message."""
    limits = source_limits(spec.max_input_bytes)
    by_id: dict[str, Conversation] = {}
    described = []
    no_user = 0
    for s in specs:
        source = open_source(s, agent=spec.agent, limits=limits, sidecar_config=spec.sidecar_config, newest=cap)
        for conv in tqdm(source.conversations(), desc=f"read {source.name}", unit="conv", leave=False):
            if not any(m.role == "user" for m in conv.messages):
                no_user += 1
                continue
            by_id.pop(conv.conversation_id, None)  # the last copy wins, and moves to the end
            by_id[conv.conversation_id] = conv
        described.append(source.describe())
    kept = list(by_id.values())[-cap:]
    if not kept:
        stats = "; ".join(
            f"{d['name']}: {d.get('lines', 0)} lines, {d.get('malformed', 0)} malformed" for d in described
        )
        raise DataError(f"no usable conversation ({stats}; {no_user} without a user message)")
    _write_jsonl(dest, [_conv_json(c) for c in kept])
    return {
        "sources": described,
        "conversations": len(kept),
        "without_user_message": no_user,
        "duplicates_dropped": sum(d.get("conversations", 0) for d in described) - no_user - len(by_id),
        "dropped_over_cap": len(by_id) - len(kept),
    }


def holdback_count(n: int, fraction: float, minimum: int) -> int:
    return max(minimum, round(n * fraction))


def split(spec: OnboardSpec, data: Path) -> dict[str, Any]:
    """Held-back slice (validation) and training conversations in ``adapters.training.lora``'s layout."""
    convs = _read_jsonl(data / "conversations.jsonl")
    n = len(convs)
    n_hold = holdback_count(n, spec.holdback_fraction, spec.min_holdback)
    if n < spec.min_conversations or n - n_hold < spec.min_holdback:
        raise DataError(
            f"too few conversations for agent {spec.agent!r}: {n} usable; onboarding needs at least "
            f"{max(spec.min_conversations, 2 * spec.min_holdback)} ({n_hold} are held back to validate)"
        )
    groups = sorted({c["split_group"] for c in convs}, key=lambda g: stable_unit(g, f"holdback:{spec.seed}"))
    held_groups: set[str] = set()
    held = 0
    for g in groups:
        if held >= n_hold:
            break
        held_groups.add(g)
        held += sum(1 for c in convs if c["split_group"] == g)
    hold = [c for c in convs if c["split_group"] in held_groups]
    train = [c for c in convs if c["split_group"] not in held_groups]
    _write_jsonl(data / "holdback.jsonl", hold)
    _write_jsonl(data / "prepared" / spec.agent / "train.jsonl", [_train_record(c) for c in train])
    mixed = _mix(spec, data / "prepared" / MIX_NAME / "train.jsonl", round(len(train) * spec.mix_ratio))
    write_manifest(
        data / "prepared", "onboarding-data", agent=spec.agent, train=len(train), holdback=len(hold), general=mixed
    )
    return {
        "train": len(train),
        "holdback": len(hold),
        "general": mixed,
        "datasets": [spec.agent, *([MIX_NAME] if mixed else [])],
    }


def _train_record(c: dict[str, Any]) -> dict[str, Any]:
    return {
        "conversation_id": c["conversation_id"],
        "messages": c["messages"],
        "target_start": target_start(messages_from_json(c["messages"])),
    }


def _mix(spec: OnboardSpec, dest: Path, want: int) -> int:
    if not spec.mix or want <= 0:
        return 0
    pool: list[Conversation] = []
    for s in spec.mix:
        source = open_source(demo_sample() if s == "demo-sample" else s, limits=source_limits(spec.max_input_bytes))
        pool.extend(c for c in source.conversations() if any(m.role == "user" for m in c.messages))
    pool.sort(key=lambda c: stable_unit(c.conversation_id, f"mix:{spec.seed}"))
    _write_jsonl(dest, [_train_record(_conv_json(c)) for c in pool[:want]])
    return min(want, len(pool))


def demo_sample() -> str:
    """The conversations bundled with the demo (STAR, MultiWOZ, tau-bench), a general mix."""
    import sidecar.tools.demo

    return str(Path(sidecar.tools.demo.__file__).parent / "data" / "sample.jsonl.gz")


def train(spec: OnboardSpec, data: Path, dest: Path, datasets: list[str], fingerprint: str) -> dict[str, Any]:
    from adapters.training.lora import train_lora

    marker = dest / ".fingerprint"
    if dest.exists() and (not marker.exists() or marker.read_text() != fingerprint):
        shutil.rmtree(dest)  # a checkpoint of other data must not be resumed
    dest.mkdir(parents=True, exist_ok=True)
    marker.write_text(fingerprint)
    return train_lora(
        data / "prepared",
        datasets,
        spec.base,
        dest,
        spec.recipe,
        init_adapter=spec.init_adapter,
        min_steps=spec.min_steps,
    )


def protocol_examples(data: Path, seed: int) -> list[tuple[str, list[Any], bool]]:
    """(conversation id, messages, complete) of the held-back slice under the truncation protocol."""
    out: list[tuple[str, list[Any], bool]] = []
    for rec in _read_jsonl(data / "holdback.jsonl"):
        conv = Conversation(rec["conversation_id"], "agent", rec["split_group"], messages_from_json(rec["messages"]))
        out.extend((conv.conversation_id, list(ex.messages), ex.complete) for ex in eval_examples(conv, seed))
    return out


def score_examples(
    base: Path,
    adapter: Path | None,
    examples: list[tuple[str, list[Any], bool]],
    *,
    max_context_tokens: int,
    max_message_tokens: int | None,
    desc: str = "score",
) -> list[ScoredExample]:
    """P(end) and the greedy verdict of every example, in-process on the same ids the sidecar sends."""
    from adapters.data.tokenizer import END_TAG, encode_messages, load_tokenizer, padding_id, special_id
    from adapters.evaluation.validate import load_model, next_token_probs

    tok = load_tokenizer(base)
    end_id = special_id(tok, END_TAG)
    model = load_model(base, adapter)
    prompts = [encode_messages(tok, m, max_message_tokens)[-max_context_tokens:] for _, m, _ in examples]
    probs, greedy = next_token_probs(model, prompts, end_id, padding_id(tok, base), desc=desc)
    return [ScoredExample(cid, y, p, g == end_id) for (cid, _, y), p, g in zip(examples, probs, greedy, strict=True)]


def validate(spec: OnboardSpec, data: Path, trained: Path) -> dict[str, Any]:
    examples = protocol_examples(data, spec.seed)
    if not any(not y for _, _, y in examples):
        raise DataError(
            "the held-back conversations all have a single user turn: the truncation protocol "
            "needs conversations of at least two turns"
        )
    ctx, cap = spec.recipe.max_context_tokens, spec.recipe.max_message_tokens
    after = score_examples(
        spec.base, trained, examples, max_context_tokens=ctx, max_message_tokens=cap, desc="validate after"
    )
    before = score_examples(
        spec.base, spec.init_adapter, examples, max_context_tokens=ctx, max_message_tokens=cap, desc="validate before"
    )
    cal = calibrate(after, objective=spec.objective, folds=spec.folds)
    rule = cal["recommended_rule"] if spec.rule == "auto" else spec.rule
    if rule == "threshold" and cal["p_end_threshold"] is None:
        raise DataError("no threshold can be calibrated: the held-back slice has one class only")
    f1 = (
        cal["greedy"]["complete"]["f1"]
        if rule == "greedy"
        else ((cal["threshold_cross_validated"] or cal["threshold_in_sample"])["complete"]["f1"])
    )
    return {
        "after": cal,
        "before": calibrate(before, objective=spec.objective, folds=spec.folds),
        "rule": rule,
        "p_end_threshold": cal["p_end_threshold"] if rule == "threshold" else None,
        "validation_f1": f1,
        "min_validation_f1": spec.min_validation_f1,
        "trusted": f1 >= spec.min_validation_f1,
        "p_end": {
            "complete": [e.p_end for e in after if e.complete],
            "incomplete": [e.p_end for e in after if not e.complete],
            "before_complete": [e.p_end for e in before if e.complete],
            "before_incomplete": [e.p_end for e in before if not e.complete],
        },
    }


def export(spec: OnboardSpec, trained: Path, dest: Path, validation: dict[str, Any]) -> dict[str, Any]:
    from adapters.onboarding.baseline import drift_baseline
    from adapters.serving.export import export_adapter

    exported = export_adapter(trained, dest, spec.base_model_name, max_lora_rank=max(8, spec.recipe.rank))
    manifest = read_manifest(dest)
    sha = manifest["adapter_sha256"]
    name = spec.served_name or f"{spec.agent}-{sha[:8]}"
    keep = ("rule", "p_end_threshold", "validation_f1", "min_validation_f1", "trusted")
    manifest.pop("kind", None)
    manifest.pop("created_utc", None)
    for k in ("code_commit", "python"):
        manifest.pop(k, None)
    after = validation["after"]
    write_manifest(
        dest,
        "exported-lora-adapter",
        **manifest,
        agent=spec.agent,
        served_name=name,
        validation={
            "protocol": "truncation (held-back slice of the agent's own conversations)",
            "f1_complete": validation["validation_f1"],
            **{k: validation[k] for k in keep if k != "validation_f1"},
            "examples": after["examples"],
            "conversations": after["conversations"],
            "greedy_f1_complete": after["greedy"]["complete"]["f1"],
            "roc_auc": after["greedy"]["roc_auc"],
            "baseline": drift_baseline(validation),
        },
    )
    return {**exported, "served_name": name, "adapter_dir": str(dest), "adapter_sha256": sha}


def run_onboarding(spec: OnboardSpec) -> dict[str, Any]:
    """All steps (see the module docstring); returns the report's JSON document."""
    from adapters.onboarding import report as onboard_report
    from adapters.serving import serving

    t0 = time.monotonic()
    out = spec.out
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    steps = Steps(out)
    fields = spec.fingerprint_fields()
    # How a batch is fed to the device changes no result: a run that ran out of GPU memory resumes
    # its training checkpoint with a smaller micro-batch, and a finished one is not redone.
    inputs = {**fields, "recipe": {k: v for k, v in fields["recipe"].items() if k != "micro_batch_size"}}
    bar = tqdm(total=len(STEPS), desc=f"onboard {spec.agent}", unit="step")

    def step(name: str, keys: tuple[str, ...], fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        result = steps.run(name, {k: inputs[k] for k in keys}, fn)
        bar.update(1)
        return result

    try:
        col = step(
            "collect",
            ("agent", "sources", "max_conversations", "max_input_bytes"),
            lambda: collect(spec, spec.sources, cap=spec.max_conversations, dest=data / "conversations.jsonl"),
        )
        spl = step(
            "split",
            ("min_conversations", "holdback_fraction", "min_holdback", "mix", "mix_ratio", "seed"),
            lambda: split(spec, data),
        )
        trn = step(
            "train",
            ("base", "init_adapter", "recipe", "min_steps"),
            lambda: train(spec, data, out / "trained", spl["datasets"], steps.fingerprint()),
        )
        val = step(
            "validate",
            ("objective", "folds", "rule", "min_validation_f1"),
            lambda: validate(spec, data, out / "trained"),
        )
        exp = step(
            "export", ("served_name", "base_model_name"), lambda: export(spec, out / "trained", out / "adapter", val)
        )
        # With a server named, loading is redone on every run (idempotent, and the server may have
        # restarted since); without one, the restart command is all there is to give.
        fields["serve_attempt"] = inputs["serve_attempt"] = time.time() if spec.vllm_url else None
        srv = step(
            "serve",
            ("vllm_url", "served_path", "serve_attempt"),
            lambda: serving.serve(
                vllm_url=spec.vllm_url,
                name=exp["served_name"],
                adapter_dir=out / "adapter",
                served_path=spec.served_path,
                base=spec.base,
                base_model_name=spec.base_model_name,
                rank=spec.recipe.rank,
            ),
        )
        snippet = serving.routing(spec.agent, exp["served_name"], val, asdict(spec.recipe))
        rte = step("route", ("config",), lambda: serving.write_routing(out, snippet, spec.config))
        doc: dict[str, Any] = {
            "agent": spec.agent,
            "collect": col,
            "split": spl,
            "train": trn,
            "validation": val,
            "export": exp,
            "serve": srv,
            "route": {**rte, "routing": snippet},
            "timings": steps.timings,
        }
        doc["wall_seconds"] = round(time.monotonic() - t0, 1)
        files = onboard_report.write(out, doc)
        bar.update(1)
    finally:
        bar.close()
    write_manifest(
        out,
        "onboarding",
        spec=fields,
        steps=steps.timings,
        fingerprint=steps.fingerprint(),
        adapter=exp,
        validation={k: val[k] for k in ("rule", "p_end_threshold", "validation_f1", "trusted")},
    )
    if not val["trusted"]:
        log.warning(
            "adapters.onboard.untrusted",
            agent=spec.agent,
            validation_f1=val["validation_f1"],
            floor=spec.min_validation_f1,
        )
    return {
        "agent": spec.agent,
        "served_name": exp["served_name"],
        "adapter_dir": exp["adapter_dir"],
        "rule": val["rule"],
        "p_end_threshold": val["p_end_threshold"],
        "validation_f1": val["validation_f1"],
        "trusted": val["trusted"],
        "serve": srv["status"],
        "restart_command": srv["restart_command"],
        "restart_command_gpu": srv.get("restart_command_gpu"),
        "routing": rte,
        "report": files,
        "wall_seconds": doc["wall_seconds"],
    }
