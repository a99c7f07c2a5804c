// Records real JavaScript agents as OTLP/JSON, for reflect-otel's tests (tests/test_js_agents.py runs it).
//
//   node record.mjs MODEL_BASE_URL OUT_DIR [OTLP_TRACES_URL]
//
// MODEL_BASE_URL is an OpenAI-compatible server (the tests start reflect_otel.testing's scripted one on loopback,
// which answers multiply(17, 23) -> add(391, 5) -> "The answer is 396."). Each scenario below runs the real npm
// packages under the OTel JS SDK and writes OUT_DIR/<scenario>.otlp.json, the OTLP/JSON request the SDK's own
// serializer makes of its spans; with OTLP_TRACES_URL the same spans are also sent there by the SDK's OTLP/protobuf
// exporter (the tests point it at reflect-otel's receiver). Prints the scenarios' answers as one JSON object.

import { writeFileSync } from "node:fs";
import { join } from "node:path";

import { createOpenAI } from "@ai-sdk/openai";
import {
  OpenInferenceSpanKind,
  SemanticConventions,
} from "@arizeai/openinference-semantic-conventions";
import { LangChainInstrumentation } from "@arizeai/openinference-instrumentation-langchain";
import { OpenAIInstrumentation } from "@arizeai/openinference-instrumentation-openai";
import * as CallbackManagerModule from "@langchain/core/callbacks/manager";
import { tool as langchainTool } from "@langchain/core/tools";
import { createReactAgent } from "@langchain/langgraph/prebuilt";
import { ChatOpenAI } from "@langchain/openai";
import { context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-proto";
import { JsonTraceSerializer } from "@opentelemetry/otlp-transformer";
import { resourceFromAttributes } from "@opentelemetry/resources";
import {
  BasicTracerProvider,
  BatchSpanProcessor,
  InMemorySpanExporter,
  SimpleSpanProcessor,
} from "@opentelemetry/sdk-trace-base";
import { generateText, stepCountIs, streamText, tool } from "ai";
import * as openaiModule from "openai";
import { z } from "zod";

const [baseURL, outDir, otlpUrl] = process.argv.slice(2);
if (!baseURL || !outDir) {
  console.error("usage: node record.mjs MODEL_BASE_URL OUT_DIR [OTLP_TRACES_URL]");
  process.exit(2);
}

const QUESTION = "What is 17 times 23, plus 5?";
const MODEL = "scripted-model";

context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
const memory = new InMemorySpanExporter();
const processors = [new SimpleSpanProcessor(memory)];
const otlp = otlpUrl ? new OTLPTraceExporter({ url: otlpUrl }) : null;
if (otlp) processors.push(new BatchSpanProcessor(otlp)); // as applications export: in batches, on flush
const provider = new BasicTracerProvider({
  resource: resourceFromAttributes({ "service.name": "js-calculator" }),
  spanProcessors: processors,
});
trace.setGlobalTracerProvider(provider);

const calculatorTools = {
  multiply: tool({
    description: "multiply two integers",
    inputSchema: z.object({ a: z.number().int(), b: z.number().int() }),
    execute: async ({ a, b }) => a * b,
  }),
  add: tool({
    description: "add two integers",
    inputSchema: z.object({ a: z.number().int(), b: z.number().int() }),
    execute: async ({ a, b }) => a + b,
  }),
};
const vercelModel = createOpenAI({ baseURL, apiKey: "test" }).chat(MODEL);
const telemetry = (functionId) => ({
  isEnabled: true,
  functionId,
  tracer: provider.getTracer("ai"),
});

// The Vercel AI SDK's generateText with two tools, its own ai.* spans on.
async function aiGenerateText() {
  const result = await generateText({
    model: vercelModel,
    system: "Compute.",
    prompt: QUESTION,
    tools: calculatorTools,
    stopWhen: stepCountIs(5),
    experimental_telemetry: telemetry("calculator"),
  });
  return result.text;
}

// The same with streamText, read to its end.
async function aiStreamText() {
  const result = streamText({
    model: vercelModel,
    system: "Compute.",
    prompt: QUESTION,
    tools: calculatorTools,
    stopWhen: stepCountIs(5),
    experimental_telemetry: telemetry("calculator-stream"),
  });
  for await (const _chunk of result.textStream); // eslint-disable-line no-unused-vars
  return await result.text;
}

// A hand-written tool loop on the openai client under OpenInference's instrumentation, its agent and tool spans
// written by hand with OpenInference's attributes (as tests/agents.py's Python loop does).
async function openInferenceOpenAI() {
  const instrumentation = new OpenAIInstrumentation({ tracerProvider: provider });
  instrumentation.manuallyInstrument(openaiModule); // ESM: the module is not loaded through require
  const client = new openaiModule.OpenAI({ baseURL, apiKey: "test" });
  const tracer = provider.getTracer("js-openai-loop");
  const functions = { multiply: ({ a, b }) => a * b, add: ({ a, b }) => a + b };
  const tools = Object.keys(functions).map((name) => ({
    type: "function",
    function: {
      name,
      description: `${name} two integers`,
      parameters: {
        type: "object",
        properties: { a: { type: "integer" }, b: { type: "integer" } },
        required: ["a", "b"],
      },
    },
  }));
  return tracer.startActiveSpan(
    "calculator",
    {
      attributes: {
        [SemanticConventions.OPENINFERENCE_SPAN_KIND]: OpenInferenceSpanKind.AGENT,
        [SemanticConventions.INPUT_VALUE]: QUESTION,
      },
    },
    async (root) => {
      const messages = [
        { role: "system", content: "Compute." },
        { role: "user", content: QUESTION },
      ];
      let message;
      for (;;) {
        const reply = await client.chat.completions.create({ model: MODEL, messages, tools });
        message = reply.choices[0].message;
        messages.push(message);
        if (!message.tool_calls?.length) break;
        for (const call of message.tool_calls) {
          const result = tracer.startActiveSpan(
            call.function.name,
            {
              attributes: {
                [SemanticConventions.OPENINFERENCE_SPAN_KIND]: OpenInferenceSpanKind.TOOL,
                [SemanticConventions.TOOL_NAME]: call.function.name,
                [SemanticConventions.TOOL_CALL_ID]: call.id,
                [SemanticConventions.INPUT_VALUE]: call.function.arguments,
              },
            },
            (span) => {
              const value = String(functions[call.function.name](JSON.parse(call.function.arguments)));
              span.setAttribute(SemanticConventions.OUTPUT_VALUE, value);
              span.end();
              return value;
            },
          );
          messages.push({ role: "tool", tool_call_id: call.id, content: result });
        }
      }
      root.setAttribute(SemanticConventions.OUTPUT_VALUE, message.content ?? "");
      root.end();
      instrumentation.disable();
      return message.content ?? "";
    },
  );
}

// LangGraph.js's prebuilt ReAct agent (ChatOpenAI, two tools) under OpenInference's LangChain.js instrumentation:
// its tool spans hold the ToolMessage the tool node made, lc-serialised inside the run's {"output": ...}.
async function openInferenceLangGraph() {
  const instrumentation = new LangChainInstrumentation({ tracerProvider: provider });
  instrumentation.manuallyInstrument(CallbackManagerModule);
  const schema = z.object({ a: z.number().int(), b: z.number().int() });
  const tools = [
    langchainTool(async ({ a, b }) => String(a * b), {
      name: "multiply",
      description: "multiply two integers",
      schema,
    }),
    langchainTool(async ({ a, b }) => String(a + b), { name: "add", description: "add two integers", schema }),
  ];
  const llm = new ChatOpenAI({ model: MODEL, apiKey: "test", configuration: { baseURL } });
  const agent = createReactAgent({ llm, tools, prompt: "Compute.", name: "calculator" });
  const result = await agent.invoke({ messages: [{ role: "user", content: QUESTION }] });
  instrumentation.disable();
  return String(result.messages.at(-1).content);
}

const scenarios = {
  "ai-generate-text": aiGenerateText,
  "ai-stream-text": aiStreamText,
  "openinference-openai": openInferenceOpenAI,
  "openinference-langgraph": openInferenceLangGraph,
};

const answers = {};
for (const [name, run] of Object.entries(scenarios)) {
  memory.reset();
  answers[name] = await run();
  await provider.forceFlush();
  const body = JsonTraceSerializer.serializeRequest(memory.getFinishedSpans());
  writeFileSync(join(outDir, `${name}.otlp.json`), `${JSON.stringify(JSON.parse(Buffer.from(body)), null, 1)}\n`);
}
await provider.shutdown();
console.log(JSON.stringify(answers));
