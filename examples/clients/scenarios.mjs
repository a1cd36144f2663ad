// scenarios.mjs: the wire scenarios of examples/clients/scenarios.sh, each
// run by one SDK against one alias (passthrough or translated): tool loops
// with parallel calls and a tool-result turn, the SDKs' stream helpers,
// images, stop sequences, reasoning, usage at a stream's end and a client
// abort mid-stream. Each case returns what the SDK saw, for the harness to
// judge; an SDK that throws fails the case.
import { generateText, streamText, streamObject, tool, jsonSchema, stepCountIs } from "ai";

const cityArgs = { type: "object", properties: { city: { type: "string" } }, required: ["city"], additionalProperties: false };
const weather = { name: "get_weather", description: "The weather in a city.", parameters: cityArgs };
const time = { name: "get_time", description: "The local time in a city.", parameters: cityArgs };
const results = { get_weather: "sunny, 21C", get_time: "14:05" };
const ask = "What are the weather and the time in Oslo?";
// A tiny PDF and a 1×1 PNG.
const pdf = "JVBERi0xLjQKJeLjz9MKMSAwIG9iago8PD4+CmVuZG9iagp0cmFpbGVyCjw8Pj4KJSVFT0YK";
const png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

// The answer of a tool-result turn must quote both results.
function quotesBoth(text) {
  if (!text.includes(results.get_weather) || !text.includes(results.get_time)) throw new Error(`the last answer does not quote both tool results: ${text.slice(0, 200)}`);
  return text;
}
// calls checks a turn's parallel calls: both tools, each with {city}.
function checkCalls(calls) {
  const names = calls.map((c) => c.name).sort().join(",");
  if (names !== "get_time,get_weather") throw new Error(`the tool calls are [${names}], want get_weather and get_time`);
  for (const c of calls) {
    const a = typeof c.args === "string" ? JSON.parse(c.args) : c.args;
    if (a?.city !== "Oslo") throw new Error(`${c.name} has arguments ${JSON.stringify(c.args)}, want {"city":"Oslo"}`);
    if (!c.id) throw new Error(`${c.name} has no call id`);
  }
  return calls.map((c) => c.name);
}

export function scenarios({ model, stream, openai, anthropic, aiOpenAI, aiAnthropic, marker }) {
  const note = marker ? ` ${marker}` : "";
  return {
    // Chat Completions: two parallel calls, then both results; streamed
    // through the SDK's stream helper and its finalChatCompletion().
    async "chat-tools"() {
      const c = openai();
      const tools = [weather, time].map((f) => ({ type: "function", function: f }));
      const messages = [{ role: "user", content: ask + note }];
      const turn = async () => {
        const body = { model, messages, tools, max_completion_tokens: 300 };
        return stream ? await c.chat.completions.stream(body).finalChatCompletion() : await c.chat.completions.create(body);
      };
      const r1 = await turn();
      const m = r1.choices[0].message;
      if (r1.choices[0].finish_reason !== "tool_calls") throw new Error(`finish_reason is ${r1.choices[0].finish_reason}, want tool_calls`);
      const names = checkCalls((m.tool_calls || []).map((t) => ({ id: t.id, name: t.function.name, args: t.function.arguments })));
      messages.push({ role: "assistant", content: m.content, tool_calls: m.tool_calls });
      for (const t of m.tool_calls) messages.push({ role: "tool", tool_call_id: t.id, content: results[t.function.name] });
      const r2 = await turn();
      return { names, said: m.content ?? "", text: quotesBoth(r2.choices[0].message.content), finish: r2.choices[0].finish_reason, usage: r2.usage };
    },
    // Responses: parallel function_call items; the next turn sends the
    // output items back with a function_call_output each.
    async "responses-tools"() {
      const c = openai();
      const tools = [weather, time].map((f) => ({ type: "function", ...f, strict: false }));
      const input = [{ role: "user", content: ask + note }];
      const turn = async () => {
        const body = { model, input, tools, max_output_tokens: 300 };
        return stream ? await c.responses.stream(body).finalResponse() : await c.responses.create(body);
      };
      const r1 = await turn();
      const calls = r1.output.filter((it) => it.type === "function_call");
      const names = checkCalls(calls.map((it) => ({ id: it.call_id, name: it.name, args: it.arguments })));
      input.push(...r1.output);
      for (const it of calls) input.push({ type: "function_call_output", call_id: it.call_id, output: results[it.name] });
      const r2 = await turn();
      return { names, said: r1.output_text, text: quotesBoth(r2.output_text), status: r2.status, usage: r2.usage };
    },
    // Messages: parallel tool_use blocks, then one user turn of both
    // tool_results; streamed through messages.stream().finalMessage().
    async "messages-tools"() {
      const c = anthropic();
      const tools = [weather, time].map((f) => ({ name: f.name, description: f.description, input_schema: f.parameters }));
      const messages = [{ role: "user", content: ask + note }];
      const turn = async () => {
        const body = { model, max_tokens: 300, messages, tools };
        return stream ? await c.messages.stream(body).finalMessage() : await c.messages.create(body);
      };
      const r1 = await turn();
      if (r1.stop_reason !== "tool_use") throw new Error(`stop_reason is ${r1.stop_reason}, want tool_use`);
      const uses = r1.content.filter((b) => b.type === "tool_use");
      const names = checkCalls(uses.map((b) => ({ id: b.id, name: b.name, args: b.input })));
      messages.push({ role: "assistant", content: r1.content });
      messages.push({ role: "user", content: uses.map((b) => ({ type: "tool_result", tool_use_id: b.id, content: results[b.name] })) });
      const r2 = await turn();
      const said = r1.content.filter((b) => b.type === "text").map((b) => b.text).join("");
      return { names, said, text: quotesBoth(r2.content.filter((b) => b.type === "text").map((b) => b.text).join("")), stop: r2.stop_reason, usage: r2.usage };
    },
    // The Vercel AI SDK's own tool loop (stopWhen), over AI_PROVIDER:
    // openai (Responses), openai-chat or anthropic; AI_STORE=false sets
    // the Responses provider's store: false (else it sends an earlier
    // answer's text back as an item_reference, which translation drops and names).
    async "ai-tools"() {
      const p = process.env.AI_PROVIDER;
      const m = p === "anthropic" ? aiAnthropic()(model) : p === "openai-chat" ? aiOpenAI().chat(model) : aiOpenAI()(model);
      const tools = {};
      for (const f of [weather, time]) tools[f.name] = tool({ description: f.description, inputSchema: jsonSchema(f.parameters), execute: async () => results[f.name] });
      const opts = { model: m, prompt: ask + note, tools, stopWhen: stepCountIs(3), maxOutputTokens: 300, maxRetries: 0 };
      if (process.env.AI_STORE === "false") opts.providerOptions = { openai: { store: false } };
      let r, err;
      if (stream) {
        r = streamText({ ...opts, onError: (e) => (err = e.error) });
        let t = "";
        for await (const d of r.textStream) t += d;
        if (err) throw err;
      } else {
        r = await generateText(opts);
      }
      const steps = await r.steps;
      const first = steps[0].toolCalls.map((c) => ({ id: c.toolCallId, name: c.toolName, args: c.input }));
      return { names: checkCalls(first), said: steps[0].text, steps: steps.length, text: quotesBoth(await r.text), usage: await r.totalUsage };
    },
    // A tool result holding an image (Claude Code's Read of a picture).
    async "messages-tool-image"() {
      const c = anthropic();
      const tools = [{ name: weather.name, description: weather.description, input_schema: weather.parameters }];
      const messages = [{ role: "user", content: "Show me the weather map of Oslo." + note }];
      const r1 = await c.messages.create({ model, max_tokens: 300, messages, tools });
      const use = r1.content.find((b) => b.type === "tool_use");
      if (!use) throw new Error(`no tool_use: ${JSON.stringify(r1.content).slice(0, 200)}`);
      messages.push({ role: "assistant", content: r1.content });
      const content = [{ type: "text", text: results.get_weather }, { type: "image", source: { type: "base64", media_type: "image/png", data: png } }];
      messages.push({ role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content }] });
      const r2 = await c.messages.create({ model, max_tokens: 300, messages, tools });
      return r2.content.find((b) => b.type === "text")?.text;
    },
    async "responses-tool-image"() {
      const c = openai();
      const tools = [{ type: "function", ...weather, strict: false }];
      const input = [{ role: "user", content: "Show me the weather map of Oslo." + note }];
      const r1 = await c.responses.create({ model, input, tools, max_output_tokens: 300 });
      const call = r1.output.find((it) => it.type === "function_call");
      if (!call) throw new Error(`no function_call: ${JSON.stringify(r1.output).slice(0, 200)}`);
      const output = [{ type: "input_text", text: results.get_weather }, { type: "input_image", image_url: `data:image/png;base64,${png}` }];
      input.push(...r1.output, { type: "function_call_output", call_id: call.call_id, output });
      const r2 = await c.responses.create({ model, input, tools, max_output_tokens: 300 });
      return r2.output_text;
    },
    // A tool the caller forces by name; the fake calls it.
    async "chat-forced"() {
      const body = { model, max_completion_tokens: 300, messages: [{ role: "user", content: ask + note }], tools: [weather, time].map((f) => ({ type: "function", function: f })), tool_choice: { type: "function", function: { name: "get_time" } } };
      const r = stream ? await openai().chat.completions.stream(body).finalChatCompletion() : await openai().chat.completions.create(body);
      return (r.choices[0].message.tool_calls || []).map((t) => t.function.name + " " + t.function.arguments);
    },
    async "responses-forced"() {
      const body = { model, max_output_tokens: 300, input: ask + note, tools: [weather, time].map((f) => ({ type: "function", ...f, strict: false })), tool_choice: { type: "function", name: "get_time" } };
      const r = stream ? await openai().responses.stream(body).finalResponse() : await openai().responses.create(body);
      return r.output.filter((it) => it.type === "function_call").map((it) => it.name + " " + it.arguments);
    },
    async "messages-forced"() {
      const body = { model, max_tokens: 300, messages: [{ role: "user", content: ask + note }], tools: [weather, time].map((f) => ({ name: f.name, description: f.description, input_schema: f.parameters })), tool_choice: { type: "tool", name: "get_time" } };
      const m = stream ? await anthropic().messages.stream(body).finalMessage() : await anthropic().messages.create(body);
      return m.content.filter((b) => b.type === "tool_use").map((b) => b.name + " " + JSON.stringify(b.input));
    },
    // The Vercel AI SDK's streamObject over AI_PROVIDER.
    async "ai-stream-object"() {
      const p = process.env.AI_PROVIDER;
      const m = p === "anthropic" ? aiAnthropic()(model) : p === "openai-chat" ? aiOpenAI().chat(model) : aiOpenAI()(model);
      let err;
      const schema = { type: "object", properties: { greeting: { type: "string" }, count: { type: "integer" } }, required: ["greeting", "count"], additionalProperties: false };
      const r = streamObject({ model: m, schema: jsonSchema(schema), prompt: "Greet." + note, maxOutputTokens: 300, maxRetries: 0, onError: (e) => (err = e.error) });
      let partials = 0;
      for await (const _ of r.partialObjectStream) partials++;
      if (err) throw err;
      return { object: await r.object, partials: partials > 0 };
    },
    // A PDF beside the text.
    async "messages-document"() {
      const content = [{ type: "text", text: "Summarize this." + note }, { type: "document", source: { type: "base64", media_type: "application/pdf", data: pdf } }];
      const r = await anthropic().messages.create({ model, max_tokens: 100, messages: [{ role: "user", content }] });
      return r.content.find((b) => b.type === "text")?.text;
    },
    // An image beside the text, in each dialect's own part.
    async "chat-image"() {
      const content = [{ type: "text", text: "Describe this." + note }, { type: "image_url", image_url: { url: `data:image/png;base64,${png}` } }];
      const r = await openai().chat.completions.create({ model, max_completion_tokens: 100, messages: [{ role: "user", content }] });
      return r.choices[0].message.content;
    },
    async "responses-image"() {
      const content = [{ type: "input_text", text: "Describe this." + note }, { type: "input_image", image_url: `data:image/png;base64,${png}` }];
      const r = await openai().responses.create({ model, max_output_tokens: 100, input: [{ role: "user", content }] });
      return r.output_text;
    },
    async "messages-image"() {
      const content = [{ type: "text", text: "Describe this." + note }, { type: "image", source: { type: "base64", media_type: "image/png", data: png } }];
      const r = await anthropic().messages.create({ model, max_tokens: 100, messages: [{ role: "user", content }] });
      return r.content.find((b) => b.type === "text")?.text;
    },
    // Stop sequences (the harness reads what the provider was asked).
    async "messages-stop"() {
      const r = await anthropic().messages.create({ model, max_tokens: 100, stop_sequences: ["END", "STOP"], messages: [{ role: "user", content: "Count." + note }] });
      return r.content.find((b) => b.type === "text")?.text;
    },
    // Usage at a stream's end: chat's include_usage chunk, messages'
    // message_delta, responses' response.completed; the SDK's own totals.
    async "chat-usage"() {
      const s = await openai().chat.completions.create({ model, max_completion_tokens: 100, stream: true, stream_options: { include_usage: true }, messages: [{ role: "user", content: "Say hi." + note }] });
      const chunks = [];
      for await (const ch of s) chunks.push(ch);
      const last = chunks.at(-1);
      return { text: chunks.map((ch) => ch.choices[0]?.delta?.content || "").join(""), lastChoices: last.choices.length, usage: last.usage ?? null, usageChunks: chunks.filter((ch) => ch.usage).length };
    },
    async "messages-usage"() {
      const m = await anthropic().messages.stream({ model, max_tokens: 100, messages: [{ role: "user", content: "Say hi." + note }] }).finalMessage();
      return { text: m.content.find((b) => b.type === "text")?.text, usage: { input_tokens: m.usage.input_tokens, output_tokens: m.usage.output_tokens }, stop: m.stop_reason };
    },
    async "responses-usage"() {
      const r = await openai().responses.stream({ model, max_output_tokens: 100, input: "Say hi." + note }).finalResponse();
      return { text: r.output_text, usage: { input_tokens: r.usage?.input_tokens, output_tokens: r.usage?.output_tokens }, status: r.status };
    },
    // Reasoning asked in each dialect; the fake answers with its own
    // reasoning block first (passthrough keeps it, translation drops it).
    async "chat-reasoning"() {
      const body = { model, max_completion_tokens: 4000, reasoning_effort: "low", messages: [{ role: "user", content: "Think, then say hi." + note }] };
      if (!stream) return { text: (await openai().chat.completions.create(body)).choices[0].message.content };
      const m = await openai().chat.completions.stream(body).finalChatCompletion();
      return { text: m.choices[0].message.content };
    },
    async "responses-reasoning"() {
      const body = { model, max_output_tokens: 4000, reasoning: { effort: "low", summary: "auto" }, input: "Think, then say hi." + note };
      const r = stream ? await openai().responses.stream(body).finalResponse() : await openai().responses.create(body);
      return { text: r.output_text, types: r.output.map((it) => it.type) };
    },
    async "messages-reasoning"() {
      const body = { model, max_tokens: 4000, thinking: { type: "enabled", budget_tokens: 1024 }, messages: [{ role: "user", content: "Think, then say hi." + note }] };
      const m = stream ? await anthropic().messages.stream(body).finalMessage() : await anthropic().messages.create(body);
      return { text: m.content.filter((b) => b.type === "text").map((b) => b.text).join(""), types: m.content.map((b) => b.type) };
    },
    // An answer cut at its output limit, in each dialect's words.
    async "chat-length"() {
      const body = { model, max_completion_tokens: 5, messages: [{ role: "user", content: "Say hi at length." + note }] };
      const r = stream ? await openai().chat.completions.stream(body).finalChatCompletion() : await openai().chat.completions.create(body);
      return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason };
    },
    async "messages-length"() {
      const body = { model, max_tokens: 5, messages: [{ role: "user", content: "Say hi at length." + note }] };
      const m = stream ? await anthropic().messages.stream(body).finalMessage() : await anthropic().messages.create(body);
      return { text: m.content.find((b) => b.type === "text")?.text, finish: m.stop_reason };
    },
    async "responses-length"() {
      const body = { model, max_output_tokens: 16, input: "Say hi at length." + note };
      const r = stream ? await openai().responses.stream(body).finalResponse() : await openai().responses.create(body);
      return { text: r.output_text, finish: `${r.status}:${r.incomplete_details?.reason}` };
    },
    async "ai-length"() {
      const p = process.env.AI_PROVIDER;
      const m = p === "anthropic" ? aiAnthropic()(model) : p === "openai-chat" ? aiOpenAI().chat(model) : aiOpenAI()(model);
      const opts = { model: m, prompt: "Say hi at length." + note, maxOutputTokens: 16, maxRetries: 0 };
      if (!stream) {
        const r = await generateText(opts);
        return { text: r.text, finish: r.finishReason };
      }
      let err;
      const r = streamText({ ...opts, onError: (e) => (err = e.error) });
      let text = "";
      for await (const d of r.textStream) text += d;
      if (err) throw err;
      return { text, finish: await r.finishReason };
    },
    async "count-tokens-across"() {
      const r = await anthropic().messages.countTokens({ model, system: "Be brief.", messages: [{ role: "user", content: "Say hi." + note }] });
      return r.input_tokens;
    },
    // The caller aborts after the first text (the fake holds its stream).
    async "chat-abort"() {
      const ac = new AbortController();
      const s = await openai().chat.completions.create({ model, max_completion_tokens: 100, stream: true, messages: [{ role: "user", content: "Say hi." + note }] }, { signal: ac.signal });
      return await abortAfterText(s, ac, (ch) => ch.choices[0]?.delta?.content);
    },
    async "messages-abort"() {
      const s = anthropic().messages.stream({ model, max_tokens: 100, messages: [{ role: "user", content: "Say hi." + note }] });
      let text = "";
      s.on("text", (t) => {
        text += t;
        s.abort();
      });
      try {
        await s.finalMessage();
      } catch (e) {
        if (text) return { text, aborted: e?.constructor?.name };
        throw e;
      }
      throw new Error("the stream ended although the caller aborted it");
    },
    async "responses-abort"() {
      const ac = new AbortController();
      const s = await openai().responses.create({ model, max_output_tokens: 100, stream: true, input: "Say hi." + note }, { signal: ac.signal });
      return await abortAfterText(s, ac, (e) => (e.type === "response.output_text.delta" ? e.delta : ""));
    },
  };
}

// abortAfterText reads s until its first text, aborts, and says so (the
// openai SDK ends the iteration quietly on its own abort).
async function abortAfterText(s, ac, textOf) {
  let text = "";
  try {
    for await (const ev of s) {
      if (ac.signal.aborted) throw new Error("the stream went on after the abort");
      text += textOf(ev) || "";
      if (text) ac.abort();
    }
  } catch (e) {
    if (text && ac.signal.aborted) return { text, aborted: e?.constructor?.name };
    throw e;
  }
  if (text && ac.signal.aborted) return { text, aborted: "iteration ended" };
  throw new Error("the stream ended without text");
}
