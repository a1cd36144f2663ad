// Command stub is a local stand-in for an LLM provider, for Brama's
// runnable examples. It speaks the three provider protocols Brama calls
// (openai-chat, anthropic-messages, openai-responses), buffered and
// streamed, and misbehaves on request: a model named "fail-500" answers 500,
// "fail-429" answers 429 with retry-after, "fail-401" answers 401, and
// "slow" logs "slow request started" and answers after 2 s (a long generation).
// POST /oauth/token stands in for a provider's OAuth token endpoint
// (BRAMA_OAUTH_<ID>_TOKEN_URL): it answers every authorization_code and
// refresh_token grant with fresh tokens, except the code "bad-code".
// It prints "listening on http://ADDR" and serves until interrupted.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "`address` to listen on")
	flag.DurationVar(&latency, "latency", 0, "how long the stub thinks before answering (a provider's own time)")
	deltas := flag.Int("deltas", 0, "text deltas in a streamed answer (default one per word of the reply)")
	flag.Parse()
	if *deltas > 0 {
		once := words
		words = make([]string, *deltas)
		for i := range words {
			words[i] = once[i%len(once)]
		}
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("listening on http://%s\n", ln.Addr())
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", chat)
	mux.HandleFunc("POST /chat/completions", chat)
	mux.HandleFunc("POST /v1/messages", messages)
	mux.HandleFunc("POST /responses", responses)
	mux.HandleFunc("POST /v1/responses", responses)
	mux.HandleFunc("POST /v1/embeddings", embeddings)
	mux.HandleFunc("POST /embeddings", embeddings)
	mux.HandleFunc("POST /oauth/token", token)
	go http.Serve(ln, mux)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
}

// latency is set once from -latency before serving starts.
var latency time.Duration

type request struct {
	Model  string `json:"model"`
	Stream bool   `json:"stream"`
}

// readRequest decodes the body and answers the misbehaving models; it
// reports whether the handler should go on.
func readRequest(w http.ResponseWriter, r *http.Request) (request, bool) {
	var req request
	time.Sleep(latency) // the provider's own thinking time, for benchmarks
	b, _ := io.ReadAll(r.Body)
	json.Unmarshal(b, &req)
	switch req.Model {
	case "fail-500":
		http.Error(w, `{"error":{"type":"server_error","message":"stub failure"}}`, 500)
		return req, false
	case "fail-429":
		w.Header().Set("Retry-After", "120")
		http.Error(w, `{"error":{"type":"rate_limit_error","message":"slow down"}}`, 429)
		return req, false
	case "fail-401":
		http.Error(w, `{"error":{"type":"authentication_error","message":"bad key"}}`, 401)
		return req, false
	case "slow":
		log.Print("slow request started")
		time.Sleep(2 * time.Second)
	}
	return req, true
}

const reply = "Hello from the stub provider."

// words are the text deltas of a streamed answer; -deltas sets how many
// before serving starts.
var words = strings.SplitAfter(reply, " ")

func sse(w http.ResponseWriter, event string, v any) {
	b, _ := json.Marshal(v)
	if event != "" {
		fmt.Fprintf(w, "event: %s\n", event)
	}
	fmt.Fprintf(w, "data: %s\n\n", b)
	w.(http.Flusher).Flush()
}

func chat(w http.ResponseWriter, r *http.Request) {
	req, ok := readRequest(w, r)
	if !ok {
		return
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{
			"id": "chatcmpl-stub", "object": "chat.completion", "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": reply}, "finish_reason": "stop"}},
			"usage":   map[string]any{"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11},
		})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for i, word := range words {
		delta := map[string]any{"content": word}
		if i == 0 {
			delta["role"] = "assistant"
		}
		sse(w, "", map[string]any{"id": "chatcmpl-stub", "object": "chat.completion.chunk", "model": req.Model, "choices": []any{map[string]any{"index": 0, "delta": delta}}})
	}
	sse(w, "", map[string]any{"id": "chatcmpl-stub", "object": "chat.completion.chunk", "model": req.Model, "choices": []any{map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": "stop"}}})
	sse(w, "", map[string]any{"id": "chatcmpl-stub", "object": "chat.completion.chunk", "model": req.Model, "choices": []any{}, "usage": map[string]any{"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}})
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func messages(w http.ResponseWriter, r *http.Request) {
	req, ok := readRequest(w, r)
	if !ok {
		return
	}
	if !req.Stream {
		json.NewEncoder(w).Encode(map[string]any{
			"id": "msg_stub", "type": "message", "role": "assistant", "model": req.Model,
			"content":     []any{map[string]any{"type": "text", "text": reply}},
			"stop_reason": "end_turn", "usage": map[string]any{"input_tokens": 5, "output_tokens": 6},
		})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	sse(w, "message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": "msg_stub", "type": "message", "role": "assistant", "model": req.Model, "content": []any{}, "usage": map[string]any{"input_tokens": 5, "output_tokens": 0}}})
	sse(w, "content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
	for _, word := range words {
		sse(w, "content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": word}})
	}
	sse(w, "content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	sse(w, "message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": "end_turn"}, "usage": map[string]any{"output_tokens": 6}})
	sse(w, "message_stop", map[string]any{"type": "message_stop"})
}

func responses(w http.ResponseWriter, r *http.Request) {
	req, ok := readRequest(w, r)
	if !ok {
		return
	}
	item := map[string]any{"type": "message", "id": "msg_stub", "role": "assistant", "status": "completed",
		"content": []any{map[string]any{"type": "output_text", "text": reply, "annotations": []any{}}}}
	resp := map[string]any{"id": "resp_stub", "object": "response", "status": "completed", "model": req.Model,
		"output": []any{item}, "usage": map[string]any{"input_tokens": 5, "output_tokens": 6, "total_tokens": 11}}
	if !req.Stream {
		json.NewEncoder(w).Encode(resp)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	sse(w, "response.created", map[string]any{"type": "response.created", "response": map[string]any{"id": "resp_stub", "status": "in_progress", "output": []any{}}})
	sse(w, "response.output_item.added", map[string]any{"type": "response.output_item.added", "output_index": 0, "item": map[string]any{"type": "message", "id": "msg_stub", "role": "assistant", "content": []any{}}})
	for _, word := range words {
		sse(w, "response.output_text.delta", map[string]any{"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "item_id": "msg_stub", "delta": word})
	}
	sse(w, "response.output_item.done", map[string]any{"type": "response.output_item.done", "output_index": 0, "item": item})
	sse(w, "response.completed", map[string]any{"type": "response.completed", "response": resp})
}

func embeddings(w http.ResponseWriter, r *http.Request) {
	req, ok := readRequest(w, r)
	if !ok {
		return
	}
	json.NewEncoder(w).Encode(map[string]any{"object": "list", "model": req.Model,
		"data": []any{map[string]any{"object": "embedding", "index": 0, "embedding": []float64{0.1, 0.2, 0.3}}}})
}

// token answers an OAuth token request (JSON for claude-code, a form for
// codex and kimi) with fresh made-up tokens.
func token(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	fields := map[string]string{}
	if json.Unmarshal(b, &fields) != nil {
		q, _ := url.ParseQuery(string(b))
		for k := range q {
			fields[k] = q.Get(k)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	grant := fields["grant_type"]
	if fields["code"] == "bad-code" || (grant != "authorization_code" && grant != "refresh_token") {
		w.WriteHeader(400)
		io.WriteString(w, `{"error":"invalid_grant","error_description":"the stub refuses this grant"}`)
		return
	}
	n := time.Now().UnixNano()
	json.NewEncoder(w).Encode(map[string]any{"access_token": fmt.Sprintf("stub-access-%d", n),
		"refresh_token": fmt.Sprintf("stub-refresh-%d", n), "expires_in": 3600})
}
