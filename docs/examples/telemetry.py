"""The quickstart's host with OpenTelemetry: each checkpoint of a turn becomes a span.

Run it with the ``otel`` extra and the OpenTelemetry SDK installed::

    python docs/examples/telemetry.py

An application configures its SDK once, with the exporters it chooses; here the spans are
kept in memory and printed, one line each, when the turn is over.
"""

from __future__ import annotations

import sys
import tempfile

import anyio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

# example: start
from kai_session_checkpoint_policy import Agent, Host, JsonlSessionPersistence, policy
from kai_session_checkpoint_policy.demo import PROVIDER, ScriptedModel, make_payment_tool
from kai_session_checkpoint_policy.telemetry import CheckpointTelemetry


async def main(root: str, exporter: InMemorySpanExporter) -> None:
    tracer_provider = TracerProvider()  # an application sets its own, once, globally
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = CheckpointTelemetry(tracer_provider=tracer_provider)
    plugins = [JsonlSessionPersistence(root), policy, telemetry]
    async with Host(plugins, autoload=False) as host:
        host.llm.register_adapter(PROVIDER, ScriptedModel())
        host.tools.register(make_payment_tool())
        session = await host.sessions.open("invoice-1042")
        agent = Agent(host, session, provider=PROVIDER, model="demo")
        await agent.run_turn("Please pay invoice 1042.")
    shown = ("kai.checkpoint.boundary", "kai.checkpoint.outcome", "gen_ai.tool.call.id")
    for span in exporter.get_finished_spans():
        attributes = span.attributes or {}
        print(span.name, *(attributes[name] for name in shown if name in attributes))


# example: end


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as scratch:
        anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else scratch, InMemorySpanExporter())
