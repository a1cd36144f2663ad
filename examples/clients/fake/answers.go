package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
)

// answer is what the fake decided to say, before it is put in a format.
type answer struct {
	kind   string // text, tool, json
	text   string
	calls  []toolCall // for kind tool: one, or several in parallel
	think  string     // reasoning shown before the answer, "" for none
	length bool       // the answer ends at its output limit
	// interleave: a chat stream starts every call, then alternates their
	// arguments (as some OpenAI-compatible servers stream parallel calls).
	interleave bool
	// noUsage: a chat stream whose caller did not ask for usage
	// (stream_options.include_usage) ends without the usage chunk.
	noUsage bool
}

// toolCall is one call the answer makes.
type toolCall struct {
	tool   string
	args   string // JSON object text, or the free-form input of a custom tool
	custom bool   // the offered tool is a custom (free-form) tool
	id     string // the scripted call id, "" for the fake's own
}

const greeting = "Hello from the fake provider."

var callSeq atomic.Int64

// decide picks the answer: quote a tool result, honour a schema, call a
// forced or the scripted tool, else greet.
func decide(format string, body map[string]any, sc script) answer {
	a := decideWhat(format, body, sc)
	a.think, a.length, a.interleave = sc.Think, sc.Finish == "length", sc.Interleave
	if a.kind == "tool" {
		a.text = sc.Say
	}
	return a
}

func decideWhat(format string, body map[string]any, sc script) answer {
	if res, ok := lastToolResult(format, body); ok {
		return answer{kind: "text", text: "The tool returned: " + clip(res, 400)}
	}
	if schema, ok := outputSchema(format, body); ok {
		b, _ := json.Marshal(fromSchema(schema, 0))
		return answer{kind: "json", text: string(b)}
	}
	if name := forcedTool(format, body); name != "" {
		t := offeredTool(body, name)
		b, _ := json.Marshal(fromSchema(toolSchema(t), 0))
		return answer{kind: "tool", calls: []toolCall{{tool: name, args: string(b)}}}
	}
	calls := sc.Calls
	if sc.Tool != "" {
		calls = append([]scriptedCall{{Tool: sc.Tool, Args: sc.Args}}, calls...)
	}
	var a answer
	for _, c := range calls {
		if t := offeredTool(body, c.Tool); t != nil {
			a.kind, a.calls = "tool", append(a.calls, toolCall{tool: c.Tool, args: c.Args, custom: t["type"] == "custom", id: c.ID})
		}
	}
	if a.kind == "tool" {
		return a
	}
	return answer{kind: "text", text: greeting}
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// lastToolResult finds a tool result that ends the conversation.
func lastToolResult(format string, body map[string]any) (string, bool) {
	switch format {
	case "messages":
		msgs, _ := body["messages"].([]any)
		if len(msgs) == 0 {
			return "", false
		}
		m, _ := msgs[len(msgs)-1].(map[string]any)
		parts, _ := m["content"].([]any)
		var res []string
		for _, p := range parts {
			if b, _ := p.(map[string]any); b["type"] == "tool_result" {
				res = append(res, flatten(b["content"]))
			}
		}
		return strings.Join(res, " | "), len(res) > 0
	case "chat":
		msgs, _ := body["messages"].([]any)
		var res []string
		for i := len(msgs) - 1; i >= 0; i-- {
			m, _ := msgs[i].(map[string]any)
			if m["role"] != "tool" {
				break
			}
			res = append([]string{flatten(m["content"])}, res...)
		}
		return strings.Join(res, " | "), len(res) > 0
	case "responses":
		items, _ := body["input"].([]any)
		var res []string
	items:
		for i := len(items) - 1; i >= 0; i-- {
			it, _ := items[i].(map[string]any)
			switch it["type"] {
			case "function_call_output", "custom_tool_call_output":
				res = append([]string{flatten(it["output"])}, res...)
				continue
			case "function_call", "custom_tool_call", "reasoning":
				continue
			}
			if it["role"] == "user" || it["type"] == "message" {
				break items
			}
		}
		return strings.Join(res, " | "), len(res) > 0
	}
	return "", false
}

// flatten gives the text of a string or of a list of parts.
func flatten(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []any:
		var sb strings.Builder
		for _, p := range x {
			if m, ok := p.(map[string]any); ok {
				if t, ok := m["text"].(string); ok {
					sb.WriteString(t)
					continue
				}
			}
			sb.WriteString(flatten(p))
		}
		return sb.String()
	case nil:
		return ""
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// outputSchema finds the JSON schema the caller asked the answer to follow.
func outputSchema(format string, body map[string]any) (any, bool) {
	var f map[string]any
	switch format {
	case "chat":
		f, _ = body["response_format"].(map[string]any)
		if js, ok := f["json_schema"].(map[string]any); ok {
			return js["schema"], true
		}
	case "responses":
		t, _ := body["text"].(map[string]any)
		f, _ = t["format"].(map[string]any)
		if f["type"] == "json_schema" {
			return f["schema"], true
		}
	case "messages":
		f, _ = body["output_format"].(map[string]any)
		if f == nil {
			oc, _ := body["output_config"].(map[string]any)
			f, _ = oc["format"].(map[string]any)
		}
		if f["type"] == "json_schema" {
			return f["schema"], true
		}
	}
	if f["type"] == "json_object" {
		return map[string]any{"type": "object", "properties": map[string]any{"answer": map[string]any{"type": "string"}}}, true
	}
	return nil, false
}

// forcedTool names the tool a tool_choice forces, or "": a named tool, or
// "any tool" (messages any, chat and responses required) when only one is
// offered (how the Vercel AI SDK asks Anthropic models for JSON).
func forcedTool(format string, body map[string]any) string {
	tc, _ := body["tool_choice"].(map[string]any)
	var name string
	switch format {
	case "messages":
		switch tc["type"] {
		case "tool":
			name, _ = tc["name"].(string)
		case "any":
			name = onlyTool(body)
		}
	case "chat", "responses":
		if fn, ok := tc["function"].(map[string]any); ok {
			name, _ = fn["name"].(string)
		} else if tc["type"] == "function" {
			name, _ = tc["name"].(string)
		} else if body["tool_choice"] == "required" {
			name = onlyTool(body)
		}
	}
	return name
}

// onlyTool names the one tool offered, or "".
func onlyTool(body map[string]any) string {
	tools, _ := body["tools"].([]any)
	if len(tools) != 1 {
		return ""
	}
	t, _ := tools[0].(map[string]any)
	if fn, ok := t["function"].(map[string]any); ok {
		t = fn
	}
	name, _ := t["name"].(string)
	return name
}

// offeredTool finds the definition of the named tool among the request's
// tools, including the Codex CLI's "additional_tools" input items.
func offeredTool(body map[string]any, name string) map[string]any {
	if t := findTool(body["tools"], name); t != nil {
		return t
	}
	items, _ := body["input"].([]any)
	for _, it := range items {
		if m, _ := it.(map[string]any); m["type"] == "additional_tools" {
			if t := findTool(m["tools"], name); t != nil {
				return t
			}
		}
	}
	return nil
}

// findTool finds the tool definition of that name anywhere in tools
// (nested groups too).
func findTool(v any, name string) map[string]any {
	switch x := v.(type) {
	case []any:
		for _, e := range x {
			if t := findTool(e, name); t != nil {
				return t
			}
		}
	case map[string]any:
		if x["name"] == name && x["type"] != "namespace" {
			return x
		}
		if fn, ok := x["function"].(map[string]any); ok && fn["name"] == name {
			return fn
		}
		if c, ok := x["custom"].(map[string]any); ok && c["name"] == name { // chat's custom tool
			return map[string]any{"type": "custom", "name": name, "format": c["format"]}
		}
		if t := findTool(x["tools"], name); t != nil {
			return t
		}
	}
	return nil
}

func toolSchema(t map[string]any) any {
	for _, k := range []string{"input_schema", "parameters"} {
		if s, ok := t[k]; ok {
			return s
		}
	}
	return map[string]any{"type": "object"}
}

// fromSchema makes a value that satisfies a (simple) JSON schema.
func fromSchema(s any, depth int) any {
	m, _ := s.(map[string]any)
	if depth > 8 || m == nil {
		return "fake"
	}
	if c, ok := m["const"]; ok {
		return c
	}
	if e, ok := m["enum"].([]any); ok && len(e) > 0 {
		return e[0]
	}
	for _, k := range []string{"anyOf", "oneOf", "allOf"} {
		if alts, ok := m[k].([]any); ok && len(alts) > 0 {
			return fromSchema(alts[0], depth+1)
		}
	}
	typ := m["type"]
	if list, ok := typ.([]any); ok && len(list) > 0 {
		typ = list[0]
	}
	switch typ {
	case "object":
		out := map[string]any{}
		props, _ := m["properties"].(map[string]any)
		for k, p := range props {
			out[k] = fromSchema(p, depth+1)
		}
		return out
	case "array":
		return []any{fromSchema(m["items"], depth+1)}
	case "integer", "number":
		return 1
	case "boolean":
		return true
	case "null":
		return nil
	}
	return "fake"
}

// event is one SSE event: name ("" for chat's data-only frames) and data.
type event struct {
	name string
	data any
}

func writeEvent(w http.ResponseWriter, e event) {
	if e.name != "" {
		fmt.Fprintf(w, "event: %s\n", e.name)
	}
	if s, ok := e.data.(string); ok {
		fmt.Fprintf(w, "data: %s\n\n", s)
	} else {
		b, _ := json.Marshal(e.data)
		fmt.Fprintf(w, "data: %s\n\n", b)
	}
	w.(http.Flusher).Flush()
}

// render writes the answer buffered or as SSE.
func render(w http.ResponseWriter, format, model string, a answer, stream bool) {
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(whole(format, model, a))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, e := range events(format, model, a) {
		writeEvent(w, e)
	}
}

func ids() (string, string) {
	n := callSeq.Add(1)
	return fmt.Sprintf("fake%d", n), fmt.Sprintf("call_fake%d", n)
}

// callID is the id of the answer's call i.
func callID(base string, i int) string {
	if i == 0 {
		return base
	}
	return fmt.Sprintf("%s_%c", base, rune('a'+i))
}

// idOr is the call's scripted id, or id.
func (c toolCall) idOr(id string) string {
	if c.id != "" {
		return c.id
	}
	return id
}

// whole is the buffered answer body.
func whole(format, model string, a answer) map[string]any {
	id, cid := ids()
	switch format {
	case "messages":
		var content []any
		if a.think != "" {
			content = append(content, map[string]any{"type": "thinking", "thinking": a.think, "signature": "sig-fake"})
		}
		if a.text != "" || a.kind != "tool" {
			content = append(content, map[string]any{"type": "text", "text": a.text})
		}
		stop := stopReason(a)
		for i, c := range a.calls {
			content = append(content, map[string]any{"type": "tool_use", "id": c.idOr(callID("toolu_"+id, i)), "name": c.tool, "input": json.RawMessage(c.args)})
		}
		return map[string]any{"id": "msg_" + id, "type": "message", "role": "assistant", "model": model,
			"content": content, "stop_reason": stop, "stop_sequence": nil,
			"usage": map[string]any{"input_tokens": 10, "output_tokens": 5}}
	case "chat":
		msg := map[string]any{"role": "assistant", "content": a.text}
		finish := chatFinish(a)
		if a.kind == "tool" {
			var calls []any
			for i, c := range a.calls {
				calls = append(calls, chatToolCall(c, c.idOr(callID(cid, i)), true))
			}
			msg["tool_calls"] = calls
			if a.text == "" {
				msg["content"] = nil
			}
		}
		return map[string]any{"id": "chatcmpl-" + id, "object": "chat.completion", "created": 1764547200, "model": model,
			"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}},
			"usage":   map[string]any{"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
	}
	return responseObject(id, model, responsesStatus(a), responsesOutput(a, id, cid, true))
}

// stopReason, chatFinish and responsesStatus say why the answer ended.
func stopReason(a answer) string {
	switch {
	case a.length:
		return "max_tokens"
	case a.kind == "tool":
		return "tool_use"
	}
	return "end_turn"
}

func chatFinish(a answer) string {
	switch {
	case a.length:
		return "length"
	case a.kind == "tool":
		return "tool_calls"
	}
	return "stop"
}

func responsesStatus(a answer) string {
	if a.length {
		return "incomplete"
	}
	return "completed"
}

func chatToolCall(c toolCall, callID string, full bool) map[string]any {
	args := c.args
	if !full {
		args = ""
	}
	if c.custom {
		return map[string]any{"id": callID, "type": "custom", "custom": map[string]any{"name": c.tool, "input": args}}
	}
	return map[string]any{"id": callID, "type": "function", "function": map[string]any{"name": c.tool, "arguments": args}}
}

// responsesOutput is the answer's output items: a reasoning item when it
// thinks, then a message or its calls.
func responsesOutput(a answer, id, cid string, done bool) []any {
	var out []any
	if a.think != "" {
		summary := []any{}
		if done {
			summary = []any{map[string]any{"type": "summary_text", "text": a.think}}
		}
		out = append(out, map[string]any{"type": "reasoning", "id": "rs_" + id, "summary": summary, "encrypted_content": "enc-fake"})
	}
	status := "completed"
	if !done {
		status = "in_progress"
	}
	content := []any{map[string]any{"type": "output_text", "text": a.text, "annotations": []any{}}}
	if !done {
		content = []any{}
	}
	if a.text != "" || a.kind != "tool" {
		out = append(out, map[string]any{"type": "message", "id": "msg_" + id, "role": "assistant", "status": status, "content": content})
	}
	if a.kind == "tool" {
		for i, c := range a.calls {
			args := c.args
			if !done {
				args = ""
			}
			item := map[string]any{"type": "function_call", "id": callID("fc_"+id, i), "call_id": c.idOr(callID(cid, i)), "name": c.tool, "arguments": args, "status": status}
			if c.custom {
				item = map[string]any{"type": "custom_tool_call", "id": callID("ctc_"+id, i), "call_id": c.idOr(callID(cid, i)), "name": c.tool, "input": args, "status": status}
			}
			out = append(out, item)
		}
	}
	return out
}

func responseObject(id, model, status string, output []any) map[string]any {
	r := map[string]any{"id": "resp_" + id, "object": "response", "created_at": 1764547200, "status": status,
		"model": model, "output": output, "parallel_tool_calls": true, "tool_choice": "auto", "tools": []any{}}
	if status == "incomplete" {
		r["incomplete_details"] = map[string]any{"reason": "max_output_tokens"}
	}
	if status != "in_progress" {
		r["usage"] = map[string]any{"input_tokens": 10, "input_tokens_details": map[string]any{"cached_tokens": 0},
			"output_tokens": 5, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": 15}
	}
	return r
}

// halves splits a text in two so every stream has more than one delta.
func halves(s string) []string {
	n := len(s) / 2
	for n > 0 && n < len(s) && (s[n]&0xC0) == 0x80 {
		n++
	}
	return []string{s[:n], s[n:]}
}

// events is the answer as a stream in the format's own framing.
func events(format, model string, a answer) []event {
	id, cid := ids()
	var evs []event
	switch format {
	case "messages":
		ev := func(typ string, data map[string]any) {
			data["type"] = typ
			evs = append(evs, event{typ, data})
		}
		ev("message_start", map[string]any{"message": map[string]any{"id": "msg_" + id, "type": "message", "role": "assistant", "model": model,
			"content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": map[string]any{"input_tokens": 10, "output_tokens": 1}}})
		index := 0
		block := func(start map[string]any, deltas ...map[string]any) {
			ev("content_block_start", map[string]any{"index": index, "content_block": start})
			for _, d := range deltas {
				ev("content_block_delta", map[string]any{"index": index, "delta": d})
			}
			ev("content_block_stop", map[string]any{"index": index})
			index++
		}
		if a.think != "" {
			h := halves(a.think)
			block(map[string]any{"type": "thinking", "thinking": "", "signature": ""},
				map[string]any{"type": "thinking_delta", "thinking": h[0]}, map[string]any{"type": "thinking_delta", "thinking": h[1]},
				map[string]any{"type": "signature_delta", "signature": "sig-fake"})
		}
		if a.text != "" || a.kind != "tool" {
			h := halves(a.text)
			block(map[string]any{"type": "text", "text": ""},
				map[string]any{"type": "text_delta", "text": h[0]}, map[string]any{"type": "text_delta", "text": h[1]})
		}
		stop := stopReason(a)
		for i, c := range a.calls {
			h := halves(c.args)
			block(map[string]any{"type": "tool_use", "id": c.idOr(callID("toolu_"+id, i)), "name": c.tool, "input": map[string]any{}},
				map[string]any{"type": "input_json_delta", "partial_json": h[0]}, map[string]any{"type": "input_json_delta", "partial_json": h[1]})
		}
		ev("message_delta", map[string]any{"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]any{"output_tokens": 5}})
		ev("message_stop", map[string]any{})
	case "chat":
		chunk := func(delta map[string]any, finish any) {
			evs = append(evs, event{"", map[string]any{"id": "chatcmpl-" + id, "object": "chat.completion.chunk", "created": 1764547200, "model": model,
				"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}})
		}
		chunk(map[string]any{"role": "assistant", "content": ""}, nil)
		finish := chatFinish(a)
		if a.text != "" {
			for _, h := range halves(a.text) {
				chunk(map[string]any{"content": h}, nil)
			}
		}
		argsDelta := func(i int, h string) {
			part, key := map[string]any{"arguments": h}, "function"
			if a.calls[i].custom {
				part, key = map[string]any{"input": h}, "custom"
			}
			chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i, key: part}}}, nil)
		}
		switch {
		case a.kind == "tool" && a.interleave: // every call starts, then their arguments alternate
			var starts []any
			for i, c := range a.calls {
				tc := chatToolCall(c, c.idOr(callID(cid, i)), false)
				tc["index"] = i
				starts = append(starts, tc)
			}
			chunk(map[string]any{"tool_calls": starts}, nil)
			for h := range 2 {
				for i, c := range a.calls {
					argsDelta(i, halves(c.args)[h])
				}
			}
		case a.kind == "tool":
			for i, c := range a.calls {
				tc := chatToolCall(c, c.idOr(callID(cid, i)), false)
				tc["index"] = i
				chunk(map[string]any{"tool_calls": []any{tc}}, nil)
				for _, h := range halves(c.args) {
					argsDelta(i, h)
				}
			}
		}
		chunk(map[string]any{}, finish)
		if !a.noUsage {
			evs = append(evs, event{"", map[string]any{"id": "chatcmpl-" + id, "object": "chat.completion.chunk", "created": 1764547200, "model": model,
				"choices": []any{}, "usage": map[string]any{"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}})
		}
		evs = append(evs, event{"", "[DONE]"})
	default:
		seq := 0
		ev := func(typ string, data map[string]any) {
			data["type"], data["sequence_number"] = typ, seq
			seq++
			evs = append(evs, event{typ, data})
		}
		ev("response.created", map[string]any{"response": responseObject(id, model, "in_progress", []any{})})
		ev("response.in_progress", map[string]any{"response": responseObject(id, model, "in_progress", []any{})})
		added, items := responsesOutput(a, id, cid, false), responsesOutput(a, id, cid, true)
		for i, it := range items {
			item := it.(map[string]any)
			itemID := item["id"]
			ev("response.output_item.added", map[string]any{"output_index": i, "item": added[i]})
			switch item["type"] {
			case "reasoning":
				part := map[string]any{"type": "summary_text", "text": ""}
				ev("response.reasoning_summary_part.added", map[string]any{"item_id": itemID, "output_index": i, "summary_index": 0, "part": part})
				for _, h := range halves(a.think) {
					ev("response.reasoning_summary_text.delta", map[string]any{"item_id": itemID, "output_index": i, "summary_index": 0, "delta": h})
				}
				ev("response.reasoning_summary_text.done", map[string]any{"item_id": itemID, "output_index": i, "summary_index": 0, "text": a.think})
				ev("response.reasoning_summary_part.done", map[string]any{"item_id": itemID, "output_index": i, "summary_index": 0,
					"part": map[string]any{"type": "summary_text", "text": a.think}})
			case "custom_tool_call":
				in := item["input"].(string)
				for _, h := range halves(in) {
					ev("response.custom_tool_call_input.delta", map[string]any{"item_id": itemID, "output_index": i, "delta": h})
				}
				ev("response.custom_tool_call_input.done", map[string]any{"item_id": itemID, "output_index": i, "input": in})
			case "function_call":
				args := item["arguments"].(string)
				for _, h := range halves(args) {
					ev("response.function_call_arguments.delta", map[string]any{"item_id": itemID, "output_index": i, "delta": h})
				}
				ev("response.function_call_arguments.done", map[string]any{"item_id": itemID, "output_index": i, "arguments": args})
			default:
				part := map[string]any{"type": "output_text", "text": "", "annotations": []any{}}
				ev("response.content_part.added", map[string]any{"item_id": itemID, "output_index": i, "content_index": 0, "part": part})
				for _, h := range halves(a.text) {
					ev("response.output_text.delta", map[string]any{"item_id": itemID, "output_index": i, "content_index": 0, "delta": h, "logprobs": []any{}})
				}
				ev("response.output_text.done", map[string]any{"item_id": itemID, "output_index": i, "content_index": 0, "text": a.text, "logprobs": []any{}})
				ev("response.content_part.done", map[string]any{"item_id": itemID, "output_index": i, "content_index": 0,
					"part": map[string]any{"type": "output_text", "text": a.text, "annotations": []any{}}})
			}
			ev("response.output_item.done", map[string]any{"output_index": i, "item": item})
		}
		final := responseObject(id, model, responsesStatus(a), items)
		ev("response."+responsesStatus(a), map[string]any{"response": final})
	}
	return evs
}
