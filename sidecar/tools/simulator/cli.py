"""``sidecar simulate``: simulated users with hidden goals talk to an assistant; the conversations
stream out as contract-v1 events, to a JSONL file (``--out``) or a Kafka topic (``--kafka``).

The user agent runs on ``--user-url``/``--user-model`` (it also checks the assistant's summaries).
Without ``--assistant-url`` the assistant is the built-in question-asking agent on the same
endpoint; with it, the assistant is your own agent, sent the conversation only (``--first-speaker
user`` suits an agent that waits for the user). A summary of the run (end reasons, turns, mean
ROUGE-1/2/L of the final summaries against the goals, calls and tokens per role) is printed, and
``--conversations-out`` keeps the conversations in the datasets' JSONL schema.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from aiokafka.errors import KafkaError
from prometheus_client import CollectorRegistry

from sidecar.errors import ConfigError
from sidecar.judge.chat import OpenAIChatClient
from sidecar.llm.config import ChatEndpointConfig
from sidecar.telemetry.config import LoggingConfig
from sidecar.telemetry.logging import configure_logging
from sidecar.tools.argtypes import whole_number
from sidecar.tools.simulator.agents import AssistantAgent, SummaryChecker, UserAgent
from sidecar.tools.simulator.config import SimulatorConfig
from sidecar.tools.simulator.dialogue import Dialogue, SimulatedConversation
from sidecar.tools.simulator.goals import load_goals
from sidecar.tools.simulator.metrics import SimulatorMetrics
from sidecar.tools.simulator.runner import RunPlan, run_summary, simulate_all
from sidecar.tools.simulator.writers import EventWriter, JsonlEventWriter, KafkaEventWriter

EXIT_OK, EXIT_FAILURE = 0, 1
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_PROMPT_FILE_BYTES = 128 * 1024


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of events per second")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and 0 < value <= 3600):
        raise argparse.ArgumentTypeError(f"{text} is not in (0, 3600] seconds")
    return value


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and 0 <= value <= 2):
        raise argparse.ArgumentTypeError(f"{text} is not in 0..2")
    return value


def add_simulate_parser(subparsers: Any) -> None:
    """Register the ``simulate`` subcommand on the root parser's subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="simulate users with hidden goals talking to an assistant; stream the events (JSONL or Kafka)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--goals",
        type=Path,
        required=True,
        metavar="FILE",
        help="goal spec JSONL(.gz): {goal, goal_id?, domain?} or dataset records with a goal field",
    )
    p.add_argument("--limit", type=whole_number(1, 10_000_000), default=None, help="simulate at most N goals")
    p.add_argument(
        "--max-file-bytes",
        type=whole_number(1, 2**40),
        default=DEFAULT_MAX_FILE_BYTES,
        help="refuse goal files larger than this",
    )
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--out", type=Path, default=None, metavar="FILE", help="write the events as JSON lines here")
    out.add_argument("--kafka", default=None, metavar="BOOTSTRAP", help="produce the events to Kafka (host:port,...)")
    p.add_argument("--topic", default="agent.conversations", help="Kafka topic (with --kafka)")
    p.add_argument("--rate", type=_rate, default=None, help="events per second at most (default: unpaced)")
    p.add_argument("--concurrency", type=whole_number(1, 1000), default=4, help="conversations simulated at once")
    p.add_argument("--max-turns", type=whole_number(1, 500), default=20, help="turn limit (user messages)")
    p.add_argument("--max-user-words", type=whole_number(1, 1000), default=30, help="the user agent's answer length")
    p.add_argument("--first-speaker", choices=["assistant", "user"], default="assistant")
    for role in ("user", "assistant"):
        p.add_argument(f"--{role}-url", default=None, help=f"the {role}'s OpenAI-compatible API root (/v1)")
        p.add_argument(f"--{role}-model", default=None, help=f"the {role}'s model name")
        p.add_argument(f"--{role}-api-key-env", default=None, metavar="VAR", help="read its API key from this env var")
        p.add_argument(f"--{role}-max-tokens", type=whole_number(8, 16384), default=None, help="cap per answer")
        p.add_argument(f"--{role}-temperature", type=_temperature, default=None, help="sampling temperature")
    p.add_argument(
        "--assistant-system-prompt-file",
        type=Path,
        default=None,
        help="system prompt for the assistant (replaces the built-in one)",
    )
    p.add_argument(
        "--structured-output",
        choices=["json_schema", "vllm_structured_outputs", "none"],
        default="json_schema",
        help="how the summary checker asks for JSON",
    )
    p.add_argument("--request-timeout", type=_seconds, default=60.0, help="seconds per chat request attempt")
    p.add_argument("--agent", default="simulated", help="the events' agent name")
    p.add_argument("--tenant", default=None, help="the events' tenant")
    p.add_argument("--id-prefix", default=None, help="conversation id prefix (default: sim-<unix time>-)")
    p.add_argument("--conversations-out", type=Path, default=None, help="write the conversations (dataset schema)")
    p.add_argument("--summary", type=Path, default=None, help="write the run summary JSON here instead of stdout")
    p.set_defaults(handler=run_simulate_command)


def _endpoint(
    args: argparse.Namespace, role: str, *, default_max_tokens: int, fallback: ChatEndpointConfig | None = None
) -> ChatEndpointConfig:
    """The ``--{role}-*`` endpoint; without ``--{role}-url``, ``fallback``'s (the built-in assistant
    shares the user agent's endpoint)."""
    url = getattr(args, f"{role}_url")
    if url is None and fallback is None:
        raise ConfigError(f"--{role}-url is required")
    base: dict[str, Any] = {}
    if url is None and fallback is not None:
        base = {**fallback.model_dump(), "api_key": fallback.api_key.get_secret_value()}
    else:
        base["base_url"] = url
    model = getattr(args, f"{role}_model")
    if model is not None or "model" not in base:
        base["model"] = model or "base"
    key_env = getattr(args, f"{role}_api_key_env")
    if key_env is not None:
        if key_env not in os.environ:
            raise ConfigError(f"--{role}-api-key-env: the environment variable {key_env} is not set")
        base["api_key"] = os.environ[key_env]
    base["max_tokens"] = getattr(args, f"{role}_max_tokens") or default_max_tokens
    temperature = getattr(args, f"{role}_temperature")
    if temperature is not None:
        base["temperature"] = temperature
    base["request_timeout_seconds"] = args.request_timeout
    base["structured_output"] = args.structured_output
    base["max_concurrency"] = args.concurrency
    try:
        return ChatEndpointConfig.model_validate(base)
    except ValueError as exc:
        raise ConfigError(f"invalid --{role}-* options: {exc}") from exc


def simulator_config(args: argparse.Namespace) -> SimulatorConfig:
    """The simulator configuration the command line describes, validated."""
    user = _endpoint(args, "user", default_max_tokens=96)
    external = args.assistant_url is not None
    assistant = _endpoint(args, "assistant", default_max_tokens=256, fallback=None if external else user)
    prompt = ""
    if args.assistant_system_prompt_file is not None:
        path: Path = args.assistant_system_prompt_file
        if not path.is_file():
            raise ConfigError(f"--assistant-system-prompt-file {path} does not exist")
        if path.stat().st_size > MAX_PROMPT_FILE_BYTES:
            raise ConfigError(f"--assistant-system-prompt-file {path} is larger than {MAX_PROMPT_FILE_BYTES} bytes")
        try:
            prompt = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from exc
    try:
        return SimulatorConfig(
            user=user,
            assistant=assistant,
            assistant_mode="external" if external else "builtin",
            assistant_system_prompt=prompt,
            first_speaker=args.first_speaker,
            max_turns=args.max_turns,
            max_user_words=args.max_user_words,
            agent=args.agent,
            tenant=args.tenant,
            concurrency=args.concurrency,
            rate=args.rate,
        )
    except ValueError as exc:
        raise ConfigError(f"invalid simulate options: {exc}") from exc


async def run_simulation(
    cfg: SimulatorConfig,
    goals_path: Path,
    writer: EventWriter,
    *,
    limit: int | None,
    max_file_bytes: int,
    id_prefix: str,
    registry: CollectorRegistry | None = None,
) -> list[SimulatedConversation]:
    """Load the goals, simulate them into ``writer`` (started and stopped here), return the conversations."""
    goals, stats = load_goals(goals_path, max_file_bytes=max_file_bytes, max_goal_chars=cfg.max_goal_chars, limit=limit)
    if not goals:
        raise ConfigError(f"no usable goal in {goals_path} (skipped: {stats.skipped})")
    user_client = OpenAIChatClient(cfg.user)
    assistant_client = user_client if cfg.assistant == cfg.user else OpenAIChatClient(cfg.assistant)
    dialogue = Dialogue(
        cfg,
        UserAgent(user_client),
        AssistantAgent(assistant_client, cfg.assistant_mode, cfg.assistant_system_prompt),
        SummaryChecker(user_client),
    )
    plan = RunPlan(cfg.agent, cfg.tenant, cfg.concurrency, cfg.rate, id_prefix)
    metrics = SimulatorMetrics(registry or CollectorRegistry())
    try:
        await writer.start()
        return await simulate_all(goals, dialogue, writer, plan, metrics)
    finally:
        await writer.stop()
        await user_client.aclose()
        if assistant_client is not user_client:
            await assistant_client.aclose()


def run_simulate_command(args: argparse.Namespace) -> int:
    """Handler of ``sidecar simulate``: 0 on success, 1 when every conversation failed, 2 on bad usage."""
    configure_logging(LoggingConfig())  # to stderr: stdout carries the summary
    cfg = simulator_config(args)
    for flag, path in (
        ("--out", args.out),
        ("--conversations-out", args.conversations_out),
        ("--summary", args.summary),
    ):
        if path is not None and not path.parent.is_dir():
            raise ConfigError(f"{flag}: directory {path.parent} does not exist")
    writer: EventWriter = KafkaEventWriter(args.kafka, args.topic) if args.kafka else JsonlEventWriter(args.out)
    prefix = args.id_prefix if args.id_prefix is not None else f"sim-{int(time.time())}-"
    if not 0 < len(prefix) <= 200:
        raise ConfigError("--id-prefix must be 1-200 characters")
    t0 = time.monotonic()
    try:
        convs = asyncio.run(
            run_simulation(
                cfg, args.goals, writer, limit=args.limit, max_file_bytes=args.max_file_bytes, id_prefix=prefix
            )
        )
    except (KafkaError, OSError) as exc:  # the destination, not the endpoints: those end conversations
        print(f"sidecar simulate: cannot write the events: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    events = getattr(writer, "sent", 0)
    summary = {
        "goals": str(args.goals),
        "destination": f"kafka:{args.topic}" if args.kafka else str(args.out),
        **run_summary(convs, events, time.monotonic() - t0),
    }
    if args.conversations_out is not None:
        with args.conversations_out.open("w", encoding="utf-8") as fh:
            for c in convs:
                fh.write(json.dumps(c.record(), ensure_ascii=False) + "\n")
    text = json.dumps(summary, indent=1, ensure_ascii=False)
    if args.summary is not None:
        args.summary.write_text(text + "\n", encoding="utf-8")
    else:
        sys.stdout.write(text + "\n")
    print(f"simulated {len(convs)} conversations, {events} events: {summary['end_reasons']}", file=sys.stderr)
    return EXIT_FAILURE if convs and all(c.end_reason == "error" for c in convs) else EXIT_OK
