// sdk.mjs runs one official-SDK case against Brama for examples/clients/run
// and prints one JSON object: {result, error, calls}, where calls are the
// HTTP exchanges the SDK made (request body as sent, response status,
// headers and body as received), so the harness can compare them with what
// the fake provider recorded.
//
// usage: node sdk.mjs CASE MODEL   (BRAMA_URL, BRAMA_CLIENT_TOKEN; STREAM=1
// streams; MAX_RETRIES, when set, is the SDK's maxRetries; MARKER goes into
// the prompt so the fake can count this request's calls). MODEL may be a
// comma-separated list (a trailing comma makes a list of one): the case
// runs once for each, one after the other,
// and the object is {results: {MODEL: {result, error}}, calls}, each call
// with the model it was made for.
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { generateText, streamText, generateObject, jsonSchema } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createAnthropic } from "@ai-sdk/anthropic";
import { scenarios } from "./scenarios.mjs";
import net from "node:net";

const [kase, models] = process.argv.slice(2);
let model = models;
const base = process.env.BRAMA_URL;
const token = process.env.BRAMA_CLIENT_TOKEN;
const stream = process.env.STREAM === "1";
const marker = process.env.MARKER || "";
const retries = process.env.MAX_RETRIES === undefined ? {} : { maxRetries: Number(process.env.MAX_RETRIES) };

const calls = [];
const pending = [];
async function recordingFetch(url, init = {}) {
  const headers = {};
  new Headers(init.headers).forEach((v, k) => (headers[k] = v));
  const c = { model, method: init.method || "GET", url: String(url), headers, body: typeof init.body === "string" ? init.body : null };
  calls.push(c);
  let res;
  try {
    res = await fetch(url, init);
  } catch (e) {
    c.error = String(e);
    throw e;
  }
  c.status = res.status;
  c.respHeaders = {};
  res.headers.forEach((v, k) => (c.respHeaders[k] = v));
  pending.push(res.clone().text().then((t) => (c.respBody = t), (e) => (c.respError = String(e))));
  return res;
}

const schema = {
  type: "object",
  properties: { greeting: { type: "string" }, count: { type: "integer" }, tags: { type: "array", items: { type: "string" } } },
  required: ["greeting", "count", "tags"],
  additionalProperties: false,
};
const prompt = `Say hi. ${marker}`.trim();

const openai = () => new OpenAI({ baseURL: `${base}/v1`, apiKey: token, fetch: recordingFetch, ...retries });
const anthropic = () => new Anthropic({ baseURL: base, apiKey: token, fetch: recordingFetch, ...retries });
// Anthropic's SDK sends x-api-key; authToken sends Authorization: Bearer.
const anthropicBearer = () => new Anthropic({ baseURL: base, authToken: token, apiKey: null, fetch: recordingFetch, ...retries });
const aiOpenAI = () => createOpenAI({ baseURL: `${base}/v1`, apiKey: token, fetch: recordingFetch });
const aiAnthropic = () => createAnthropic({ baseURL: `${base}/v1`, apiKey: token, fetch: recordingFetch });

async function collect(s) {
  if (!stream) return s;
  const events = [];
  for await (const e of s) events.push(e);
  return events;
}

const cases = {
  // Same-format members Brama must pass through untouched (SPEC §7.6).
  async "chat-pass"() {
    const r = await openai().chat.completions.create({
      model,
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: prompt },
        { role: "system", content: "A system message in mid-conversation." },
      ],
      response_format: { type: "json_schema", json_schema: { name: "greeting", strict: true, schema } },
      store: false,
      prompt_cache_key: "pck-chat",
      metadata: { run: "clients" },
      future_member: { keep: ["me", 1] },
      max_completion_tokens: 200,
      ...(stream ? { stream: true, stream_options: { include_usage: true } } : {}),
    });
    const out = await collect(r);
    return stream ? out.map((c) => c.choices[0]?.delta?.content || "").join("") : out.choices[0].message.content;
  },
  async "responses-pass"() {
    const r = await openai().responses.create({
      model,
      instructions: "Be brief.",
      input: [
        { role: "user", content: prompt },
        { role: "system", content: "A system message in mid-conversation." },
      ],
      text: { format: { type: "json_schema", name: "greeting", strict: true, schema } },
      store: false,
      include: ["reasoning.encrypted_content"],
      prompt_cache_key: "pck-responses",
      max_output_tokens: 300,
      reasoning: { effort: "low" },
      future_member: { keep: ["me", 1] },
      ...(stream ? { stream: true } : {}),
    });
    const out = await collect(r);
    return stream ? out.filter((e) => e.type === "response.output_text.delta").map((e) => e.delta).join("") : out.output_text;
  },
  async "messages-pass"() {
    const r = await anthropic().messages.create(
      {
        model,
        max_tokens: 2048,
        system: [{ type: "text", text: "Be brief.", cache_control: { type: "ephemeral" } }],
        messages: [
          { role: "user", content: [{ type: "text", text: prompt, cache_control: { type: "ephemeral" } }] },
          { role: "system", content: "A system message in mid-conversation." },
        ],
        thinking: { type: "enabled", budget_tokens: 1024 },
        output_config: { format: { type: "json_schema", schema } },
        metadata: { user_id: "clients-check" },
        future_member: { keep: ["me", 1] },
        ...(stream ? { stream: true } : {}),
      },
      { headers: { "anthropic-beta": "interleaved-thinking-2025-05-14,context-management-2025-06-27" } },
    );
    const out = await collect(r);
    return stream ? out.filter((e) => e.type === "content_block_delta").map((e) => e.delta.text || "").join("") : out.content[0].text;
  },
  async "messages-bearer"() {
    const r = await anthropicBearer().messages.create({ model, max_tokens: 100, messages: [{ role: "user", content: prompt }] });
    return r.content[0].text;
  },
  // A buffered answer whose connection drops mid-body, cut by a proxy between the SDK and Brama after the head and 8
  // bytes: the Anthropic SDK (1.17+) sends the request again unless the answer said x-should-retry: false.
  async "messages-cut-answer"() {
    const brama = new URL(base);
    const proxy = net.createServer((c) => {
      const up = net.connect(Number(brama.port), brama.hostname);
      let head = Buffer.alloc(0);
      c.pipe(up);
      up.on("data", (d) => {
        head = Buffer.concat([head, d]);
        const end = head.indexOf("\r\n\r\n");
        if (end >= 0) c.end(head.subarray(0, end + 4 + 8), () => (c.destroy(), up.destroy()));
      });
      c.on("error", () => up.destroy());
      up.on("error", () => c.destroy());
    });
    await new Promise((ok) => proxy.listen(0, "127.0.0.1", ok));
    try {
      const client = new Anthropic({ baseURL: `http://127.0.0.1:${proxy.address().port}`, apiKey: token, fetch: recordingFetch, ...retries });
      const r = await client.messages.create({ model, max_tokens: 100, messages: [{ role: "user", content: prompt }] });
      return r.content[0].text;
    } finally {
      proxy.close();
    }
  },
  async "count-tokens"() {
    const r = await anthropic().messages.countTokens({ model, system: "Be brief.", messages: [{ role: "user", content: prompt }] });
    return r.input_tokens;
  },
  // Structured output across formats: the answer must be JSON of the schema.
  async "chat-schema"() {
    const r = await openai().chat.completions.create({
      model,
      max_completion_tokens: 400,
      messages: [{ role: "user", content: prompt }],
      response_format: { type: "json_schema", json_schema: { name: "greeting", strict: true, schema } },
    });
    return r.choices[0].message.content;
  },
  async "responses-schema"() {
    const r = await openai().responses.create({
      model,
      max_output_tokens: 400,
      input: prompt,
      text: { format: { type: "json_schema", name: "greeting", strict: true, schema } },
    });
    return r.output_text;
  },
  async "messages-schema"() {
    const r = await anthropic().messages.create({
      model,
      max_tokens: 400,
      messages: [{ role: "user", content: prompt }],
      output_config: { format: { type: "json_schema", schema } },
    });
    return r.content.find((b) => b.type === "text")?.text;
  },
  // A hosted tool the target format has no counterpart for.
  async "responses-hosted-tool"() {
    const r = await openai().responses.create({
      model,
      max_output_tokens: 400,
      input: prompt,
      tools: [
        { type: "file_search", vector_store_ids: ["vs_fake"] },
        { type: "function", name: "lookup", description: "Look a word up.", parameters: { type: "object", properties: { word: { type: "string" } }, required: ["word"] } },
      ],
    });
    return r.output_text;
  },
  // The Vercel AI SDK.
  async "ai-generate-openai"() {
    const r = await generateText({ model: aiOpenAI()(model), prompt, ...retries });
    return r.text;
  },
  async "ai-generate-openai-chat"() {
    const r = await generateText({ model: aiOpenAI().chat(model), prompt, ...retries });
    return r.text;
  },
  async "ai-stream-openai"() {
    let err;
    const r = streamText({ model: aiOpenAI()(model), prompt, onError: (e) => (err = e.error) });
    let t = "";
    for await (const d of r.textStream) t += d;
    if (err) throw err;
    return t;
  },
  async "ai-generate-anthropic"() {
    const r = await generateText({ model: aiAnthropic()(model), prompt, maxOutputTokens: 400, ...retries });
    return r.text;
  },
  async "ai-stream-anthropic"() {
    let err;
    const r = streamText({ model: aiAnthropic()(model), prompt, maxOutputTokens: 400, onError: (e) => (err = e.error) });
    let t = "";
    for await (const d of r.textStream) t += d;
    if (err) throw err;
    return t;
  },
  async "ai-object-openai"() {
    const r = await generateObject({ model: aiOpenAI()(model), schema: jsonSchema(schema), prompt, maxOutputTokens: 400 });
    return JSON.stringify(r.object);
  },
  async "ai-object-openai-chat"() {
    const r = await generateObject({ model: aiOpenAI().chat(model), schema: jsonSchema(schema), prompt, maxOutputTokens: 400 });
    return JSON.stringify(r.object);
  },
  async "ai-object-anthropic"() {
    const r = await generateObject({ model: aiAnthropic()(model), schema: jsonSchema(schema), prompt, maxOutputTokens: 400 });
    return JSON.stringify(r.object);
  },
  // Refusals: default settings unless MAX_RETRIES is set.
  async "refuse-openai"() {
    const r = await openai().chat.completions.create({ model, messages: [{ role: "user", content: prompt }], ...(stream ? { stream: true } : {}) });
    return JSON.stringify(await collect(r));
  },
  async "refuse-anthropic"() {
    const r = await anthropic().messages.create({ model, max_tokens: 100, messages: [{ role: "user", content: prompt }], ...(stream ? { stream: true } : {}) });
    return JSON.stringify(await collect(r));
  },
  async "refuse-ai"() {
    if (stream) return await cases["ai-stream-openai"]();
    return await cases["ai-generate-openai"]();
  },
};

async function run() {
  const all = { ...cases, ...scenarios({ model, stream, marker, openai, anthropic, aiOpenAI, aiAnthropic }) };
  try {
    if (!all[kase]) throw new Error(`unknown case ${kase}`);
    return { result: await all[kase]() };
  } catch (e) {
    return { error: { name: e?.constructor?.name, message: String(e?.message || e).slice(0, 600), status: e?.status ?? e?.statusCode } };
  }
}

let out = {};
if (models.includes(",")) {
  out.results = {};
  for (model of models.split(",").filter(Boolean)) out.results[model] = await run();
} else {
  out = await run();
}
await Promise.allSettled(pending);
process.stdout.write(JSON.stringify({ ...out, calls }) + "\n");
