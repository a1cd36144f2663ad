#!/usr/bin/env bash
# README "Quick start", with a local OpenAI-compatible server (Ollama,
# llama.cpp's llama-server): a local-openai deployment in the registry, no
# key. The stub speaks the OpenAI-compatible API on a loopback port, as
# `ollama serve` does on 11434.
. "$(dirname "$0")/lib.sh"
start_stub
port=${STUB_URL##*:} # Ollama: 11434
start_brama
export BRAMA_TOKEN=$TOKEN
# --- README block ---
"$BRAMA" deployments add ollama -port "$port" -model llama3.2
"$BRAMA" routes set chat ollama
out=$(curl -s "$BRAMA_URL/v1/chat/completions" -H "Authorization: Bearer $BRAMA_TOKEN" \
	-d '{"model":"chat","messages":[{"role":"user","content":"Say hi"}]}')
# --- end ---
expect "a first real answer, no key" "$(echo "$out" | jq -r '.choices[0].message.content')" "Hello from the stub provider."
expect "the server was asked for its own model (the stub echoes it)" "$(echo "$out" | jq -r .model)" "llama3.2"
expect "served by the deployment" "$(curl -s -H "Authorization: Bearer $BRAMA_TOKEN" "$BRAMA_URL/v1/aliases" | jq -r '.aliases[] | select(.alias=="chat") | .state + " " + .route')" "serving ollama"
