package main

import (
	"context"
	"encoding/json"
	"net/http"
)

// serveEmbeddings makes the one call of POST /v1/embeddings (SPEC §15) on a
// direct route to an openai-chat provider; its JSON is written as is.
func (e *engine) serveEmbeddings(ctx context.Context, w http.ResponseWriter, model string, body map[string]json.RawMessage, c call) error {
	switch {
	case c.res.Mode != modeDirect && c.res.Mode != modeAlias:
		return refuse("invalid_request", "embeddings take a direct or alias route; %q is paid by a subscription", model)
	case c.res.Provider.protocol != protoOpenAIChat:
		return refuse("invalid_request", "embeddings need an openai-chat provider; %q speaks %s", c.res.Provider.id, c.res.Provider.protocol)
	}
	body["model"], _ = json.Marshal(c.res.Model)
	out, _ := json.Marshal(body)
	j := &job{
		kind: kindEmbeddings,
		build: func(ctx context.Context, _ *candidate, c call) (*http.Request, error) {
			return newPassthroughRequest(ctx, c, nil, "/embeddings", out, false)
		},
		commit: func(_ context.Context, _ *candidate, c call, _ *overlayItem, resp *http.Response, attempts int) (usage, *apiError, bool) {
			w.Header().Set("Brama-Route", c.res.Route)
			u, ae := relayBuffered(w, &callerRequest{}, c, resp, attempts) // a JSON object as received, else provider_failure
			return u, ae, false
		},
	}
	if ae := e.attemptRoute(ctx, j, c, nil); ae != nil {
		return ae
	}
	return nil
}
