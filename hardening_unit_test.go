package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCheckKeysDepth(t *testing.T) {
	tests := []struct {
		name, doc string
		wantErr   string
	}{
		{"flat", `{"a":1,"b":[1,2,{"c":3}]}`, ""},
		{"duplicate at the top", `{"a":1,"a":2}`, `duplicate key "a"`},
		{"duplicate deep", `{"x":[{"y":{"k":1,"k":2}}]}`, `duplicate key "k"`},
		{"same key in sibling objects", `[{"k":1},{"k":2}]`, ""},
		{"key equal to a value", `{"a":"b","b":"a"}`, ""},
		{"1000 levels", strings.Repeat("[", 1000) + strings.Repeat("]", 1000), ""},
		{"1001 levels", strings.Repeat("[", 1001) + strings.Repeat("]", 1001), "deeper than 1000"},
		{"3,000,000 levels", strings.Repeat(`{"a":`, 3_000_000), "deeper than 1000"},
		{"scalar", `"x"`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := decodeStrict("doc", []byte(tc.doc), new(any))
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestDeepStateFileIsRefused(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "vault.json")
	if err := os.WriteFile(name, []byte(strings.Repeat("[", 3_000_000)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := newVault(name, nil).load()
	if err == nil || !strings.Contains(err.Error(), "vault: JSON nests deeper than 1000 levels") {
		t.Errorf("a 3,000,000-deep vault: %v, want a refusal naming the vault and the depth", err)
	}
}

// jsonDepth is the deepest nesting of a valid JSON document, by the
// decoder's own tokens: the reference checkNesting is fuzzed against.
func jsonDepth(b []byte) int {
	dec := json.NewDecoder(bytes.NewReader(b))
	depth, deepest := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return deepest
		}
		switch tok {
		case json.Delim('['), json.Delim('{'):
			depth++
			deepest = max(deepest, depth)
		case json.Delim(']'), json.Delim('}'):
			depth--
		}
	}
}

func FuzzCheckNesting(f *testing.F) {
	f.Add([]byte(`{"a":[1,{"b":"[[[{{{"}]}`))
	f.Add([]byte(`["\"[[[", "\\", {"k\\\"[":[]}]`))
	f.Add([]byte(strings.Repeat("[", 1001) + strings.Repeat("]", 1001)))
	f.Add([]byte(strings.Repeat(`{"a":`, 1000) + "1" + strings.Repeat("}", 1000)))
	f.Add([]byte(`not json [[[`))
	f.Add([]byte(`["\"` + strings.Repeat("[", 1001) + `"]`))       // brackets in a string after an escaped quote: depth 1
	f.Add([]byte("[" + strings.Repeat("[],", 1001) + "[]]"))       // wide, not deep: every ] closes
	f.Add([]byte("[" + strings.Repeat(`{"a":{}},`, 1001) + "{}]")) // and every }
	f.Fuzz(func(t *testing.T, b []byte) {
		err := checkNesting(b)
		if err != nil && !errors.Is(err, errTooDeep) {
			t.Fatalf("unclassified error: %v", err)
		}
		if !json.Valid(b) {
			return
		}
		if deep := jsonDepth(b) > maxJSONDepth; deep != (err != nil) {
			t.Fatalf("checkNesting = %v for a document %d deep", err, jsonDepth(b))
		}
		if dup := decodeStrict("doc", b, new(any)); utf8.Valid(b) && errors.Is(dup, errTooDeep) != (err != nil) {
			t.Fatalf("decodeStrict (%v) and checkNesting (%v) disagree on depth", dup, err)
		}
	})
}

func TestReadyzJournalWarningsAreBounded(t *testing.T) {
	env := stateEnv(t)
	dir := env["BRAMA_STATE_DIR"]
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	buf.WriteString(`{"kind":"retire","at":"2026-11-29T22:00:00.000Z","subscription_id":"sub_0123456789abcdef","reason":"r"}` + "\n")
	for range 150 {
		buf.WriteString("not json\n")
	}
	name := filepath.Join(dir, "journal.jsonl")
	if err := os.WriteFile(name, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	warnings := func() []string {
		_, _, b := d.call("GET", "/readyz", "", "")
		var rd readiness
		if err := json.Unmarshal(b, &rd); err != nil {
			t.Fatal(err)
		}
		var journal []string
		for _, w := range rd.Warnings {
			if strings.Contains(w, "journal") {
				journal = append(journal, w)
			}
		}
		return journal
	}
	w := warnings()
	if len(w) != maxReportedBadLines+1 || w[0] != "journal line 2 is unreadable: not JSON" || !strings.Contains(w[len(w)-1], "50 more unreadable lines") {
		t.Fatalf("warnings %d: first %q, last %q; want lines 2… one by one, then 50 more counted", len(w), w[0], w[len(w)-1])
	}
	f, err := os.OpenFile(name, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("[]\n")
	f.Close()
	if w := warnings(); !strings.Contains(w[len(w)-1], "51 more unreadable lines") {
		t.Errorf("after one more bad line the last warning is %q, want 51 more", w[len(w)-1])
	}
	if err := os.WriteFile(name+".new", []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(name+".new", name); err != nil {
		t.Fatal(err)
	}
	if w := warnings(); len(w) != 1 || w[0] != "journal line 1 is unreadable: missing kind" {
		t.Errorf("after the journal was replaced: %q, want only its line 1", w)
	}
}

// TestReadmeCLITable keeps README's CLI table whole: each row has its
// three cells (command, what, example) and names a command once.
func TestReadmeCLITable(t *testing.T) {
	b, err := os.ReadFile("REFERENCE.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n## CLI\n")
	if !ok {
		t.Fatal("README has no CLI section")
	}
	rest, _, _ = strings.Cut(rest, "\n## ")
	seen := map[string]bool{}
	rows := 0
	for _, line := range strings.Split(rest, "\n") {
		if !strings.HasPrefix(line, "| `brama ") {
			continue
		}
		rows++
		cells := strings.Split(strings.ReplaceAll(line, `\|`, ""), "|")
		if len(cells) != 5 { // "" + three cells + ""
			t.Errorf("CLI row with %d cells, want 3: %.120s", len(cells)-2, line)
			continue
		}
		cmd := strings.TrimSpace(cells[1])
		if seen[cmd] {
			t.Errorf("CLI table names %s twice", cmd)
		}
		seen[cmd] = true
	}
	if rows < 10 {
		t.Errorf("CLI table has %d rows; it was not found whole", rows)
	}
}

func FuzzPresentedToken(f *testing.F) {
	f.Add("Bearer brama_abc", "", uint8(1), uint8(0))
	f.Add("", "brama_abc", uint8(0), uint8(1))
	f.Add("Bearer a, Bearer b", "brama_abc", uint8(1), uint8(1))
	f.Add("bearer  x ", " y ", uint8(2), uint8(0))
	f.Fuzz(func(t *testing.T, auth, key string, nAuth, nKey uint8) {
		h := http.Header{}
		for range nAuth % 3 {
			h.Add("Authorization", auth)
		}
		for range nKey % 3 {
			h.Add("X-Api-Key", key)
		}
		tok, err := presentedToken(h)
		if err != nil {
			if msg := asAPIError(err).Message; tok != "" || !strings.HasPrefix(msg, "no token: ") && !strings.HasPrefix(msg, "two tokens: ") && msg != notAClient {
				t.Fatalf("refusal %q (token %q): want one of the fixed sentences, quoting nothing", msg, tok)
			}
			return
		}
		if nAuth%3 > 1 || nKey%3 > 1 {
			t.Fatalf("token %q accepted from %d Authorization and %d x-api-key headers", tok, nAuth%3, nKey%3)
		}
		if k := strings.TrimSpace(key); nKey%3 == 1 && k != "" && k != tok { // both headers: one token only
			t.Fatalf("token %q accepted beside x-api-key %q", tok, k)
		}
		if strings.ContainsAny(tok, " \t,") || !strings.Contains(auth+key, tok) {
			t.Fatalf("token %q is not one clean token of the header sent", tok)
		}
	})
}
