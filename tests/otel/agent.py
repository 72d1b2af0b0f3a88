"""A small agent instrumented with OpenTelemetry, run as its own process by the end-to-end tests.

It talks to an OpenAI-compatible server with the ``openai`` client, is instrumented with one of the
GenAI instrumentations nobody here wrote, and exports its spans with the SDK's OTLP/HTTP exporter
to the sidecar's receiver, the way an agent in production would. Each conversation is opened the
way its instrumentation's users open one (an agent span per turn carrying the conversation id, or
OpenInference's ``using_session``), and ends with the agent's own end marker in its last turn's
trace. What the agent sent and received is written to ``--out`` as the native transcript: the
messages a native v1 producer would have sent.

    python -m tests.otel.agent --instrumentation openai_v2 --base-url http://127.0.0.1:8000/v1 \\
        --model base --endpoint http://127.0.0.1:4318/v1/traces --token T --prefix c --out out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

INSTRUMENTATIONS = ("openai_v2", "openinference", "openllmetry")
END_MARKER = "app.conversation.ended"
AGENT = "desk"
SYSTEM = "You are the booking desk of a small restaurant."
USER_TURNS = ("A table for two tonight, please.", "At eight, by the window.", "Thanks, that is all.")


def _instrument(name: str, provider: Any) -> Callable[[], None]:
    """Instrument the openai client; returns the undo."""
    if name == "openai_v2":
        # Content on the span itself (2.4b0 reads these under the latest experimental semconv).
        os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
        os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "SPAN_ONLY"
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

        v2 = OpenAIInstrumentor()  # type: ignore[no-untyped-call]
        v2.instrument(tracer_provider=provider)
        return v2.uninstrument  # type: ignore[no-any-return]
    if name == "openinference":
        from openinference.instrumentation.openai import OpenAIInstrumentor as OpenInferenceInstrumentor

        oi = OpenInferenceInstrumentor()
        oi.instrument(tracer_provider=provider)
        return oi.uninstrument  # type: ignore[no-any-return]
    os.environ["TRACELOOP_TRACE_CONTENT"] = "true"
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor as OpenLLMetryInstrumentor

    ol = OpenLLMetryInstrumentor()
    ol.instrument(tracer_provider=provider)
    return ol.uninstrument  # type: ignore[no-any-return]


def _turn_span(name: str, tracer: Any, cid: str) -> contextlib.AbstractContextManager[Any]:
    """The agent's span around one turn, carrying what its instrumentation's users put there."""
    if name == "openinference":
        from openinference.instrumentation import using_session

        stack = contextlib.ExitStack()
        stack.enter_context(using_session(cid))
        stack.enter_context(
            tracer.start_as_current_span("agent", attributes={"openinference.span.kind": "AGENT", "agent.name": AGENT})
        )
        return stack
    return tracer.start_as_current_span(  # type: ignore[no-any-return]
        f"invoke_agent {AGENT}",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": AGENT, "gen_ai.conversation.id": cid},
    )


def run(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    import openai
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": f"agent-{args.instrumentation}"}))
    exporter = OTLPSpanExporter(endpoint=args.endpoint, headers={"Authorization": f"Bearer {args.token}"})
    # Exported once per turn (the flush below): a turn's spans travel in one request, as they do
    # with the default 5 s schedule for turns shorter than that, and never split by the timer.
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=600_000))
    undo = _instrument(args.instrumentation, provider)
    tracer = provider.get_tracer("agent")
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=120)
    transcripts: dict[str, list[dict[str, Any]]] = {}
    try:
        for c in range(args.conversations):
            cid = f"{args.prefix}-{c}"
            messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
            for t, text in enumerate(USER_TURNS[: args.turns]):
                with _turn_span(args.instrumentation, tracer, cid):
                    messages.append({"role": "user", "content": f"{text} ({cid})"})
                    answer = client.chat.completions.create(
                        model=args.model,
                        messages=messages,  # type: ignore[arg-type]
                        max_tokens=args.max_tokens,
                        temperature=0.0,
                        # vLLM's: a model with random weights would often end at once, and an empty
                        # reply proves little about how replies travel
                        extra_body={"min_tokens": args.max_tokens},
                    )
                    messages.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
                    if t == args.turns - 1:  # the agent's own end marker, in the last turn's trace
                        with tracer.start_as_current_span("conversation.end", attributes={END_MARKER: True}):
                            pass
                provider.force_flush(30_000)
            transcripts[cid] = messages
    finally:
        client.close()
        undo()
        provider.force_flush(30_000)
        provider.shutdown()
    return transcripts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instrumentation", choices=INSTRUMENTATIONS, required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--endpoint", required=True, help="the receiver's /v1/traces URL")
    parser.add_argument("--token", required=True)
    parser.add_argument("--prefix", required=True, help="conversation ids are PREFIX-0, PREFIX-1, ...")
    parser.add_argument("--conversations", type=int, default=2)
    parser.add_argument("--turns", type=int, default=2, choices=range(1, len(USER_TURNS) + 1))
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.write_text(json.dumps(run(args)))


if __name__ == "__main__":
    main()
