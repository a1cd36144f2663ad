package main

// Tests of the journal's line format: the pure parser, the record encoding
// and the fuzz target. The file operations are tested in journal_test.go.

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// badLine is one unreadable line: its number and reason.
type badLine struct {
	Line   int
	Reason string
}

// readJournalLines parses journal bytes as the journal reads its file (SPEC
// §9): each line ending in '\n' is a record or a bad line; a final line
// without one is torn and ignored.
func readJournalLines(t *testing.T, data []byte) (recs []journalRecord, bad []badLine, torn bool) {
	j, _ := newTestJournal(t)
	writeJournalFile(t, j, string(data))
	var fo journalFold
	torn, err := j.scan(&fo, func(rec journalRecord, reason string) {
		if reason != "" {
			bad = append(bad, badLine{Line: fo.lines, Reason: reason})
		} else {
			recs = append(recs, rec)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return recs, bad, torn
}

func TestJournalRecordMarshal(t *testing.T) {
	tests := []struct {
		name string
		rec  journalRecord
		want string
	}{
		{"route create", journalRecord{Kind: "route_change", routeChange: &routeChange{To: journalPtr("openai/gpt-5")}, At: "t", Alias: "best", By: "cli"},
			`{"kind":"route_change","at":"t","alias":"best","from":null,"to":"openai/gpt-5","by":"cli"}`},
		{"route delete", journalRecord{Kind: "route_change", routeChange: &routeChange{From: journalPtr("openai/gpt-5")}, At: "t", Alias: "best", By: "admin"},
			`{"kind":"route_change","at":"t","alias":"best","from":"openai/gpt-5","to":null,"by":"admin"}`},
		{"route update", journalRecord{Kind: "route_change", routeChange: &routeChange{From: journalPtr("a/b"), To: journalPtr("c/d")}, At: "t", Alias: "x", By: "cli"},
			`{"kind":"route_change","at":"t","alias":"x","from":"a/b","to":"c/d","by":"cli"}`},
		{"other kinds omit from and to", journalRecord{Kind: "retire", At: "t", SubscriptionID: "s"},
			`{"kind":"retire","at":"t","subscription_id":"s"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, v := range []any{tt.rec, &tt.rec} {
				got, err := json.Marshal(v)
				if err != nil {
					t.Fatal(err)
				}
				if string(got) != tt.want {
					t.Errorf("marshal %T = %s, want %s", v, got, tt.want)
				}
			}
		})
	}
}

func TestReadJournalLines(t *testing.T) {
	tests := []struct {
		name string
		data string
		recs []journalRecord
		bad  []badLine
		torn bool
	}{
		{"empty", "", nil, nil, false},
		{"only torn", `{"kind":"a","at":"t"}`, nil, nil, true},
		{"complete but unterminated final line is torn", "{\"kind\":\"a\",\"at\":\"t\"}\n{\"kind\":\"b\",\"at\":\"t\"}",
			[]journalRecord{{Kind: "a", At: "t"}}, nil, true},
		{"crlf and spaces", " {\"kind\":\"a\",\"at\":\"t\"} \r\n", []journalRecord{{Kind: "a", At: "t"}}, nil, false},
		{"unknown fields skipped", `{"kind":"new","at":"t","extra":{"x":[1]},"reason":"r"}` + "\n",
			[]journalRecord{{Kind: "new", At: "t", Reason: "r"}}, nil, false},
		{"keys match exactly", `{"KIND":"a","at":"t"}` + "\n{\"kind\":\"a\",\"At\":\"t\"}\n", nil,
			[]badLine{{1, "missing kind"}, {2, "missing at"}}, false},
		{"case-folded field is unknown", `{"kind":"retire","at":"t","Subscription_ID":"s"}` + "\n",
			[]journalRecord{{Kind: "retire", At: "t"}}, nil, false},
		{"from ignored off route_change", `{"kind":"retire","at":"t","from":"x","to":5}` + "\n",
			[]journalRecord{{Kind: "retire", At: "t"}}, nil, false},
		{"route_change from and to", `{"kind":"route_change","at":"t","from":null,"to":"a/b"}` + "\n",
			[]journalRecord{{Kind: "route_change", At: "t", routeChange: &routeChange{To: journalPtr("a/b")}}}, nil, false},
		{"route_change to wrong type", `{"kind":"route_change","at":"t","from":null,"to":5}` + "\n", nil,
			[]badLine{{1, "field to has the wrong type"}}, false},
		{"empty kind and null at", "{\"kind\":\"\",\"at\":\"t\"}\n{\"kind\":\"a\",\"at\":null}\n", nil,
			[]badLine{{1, "kind is empty or not a string"}, {2, "at is empty or not a string"}}, false},
		{"number for a string", `{"kind":"a","at":"t","reason":1.5}` + "\n", nil,
			[]badLine{{1, "field reason has the wrong type"}}, false},
		{"retired kinds' fields skipped", `{"kind":"check","at":"t","score":"x","attempted":1.5}` + "\n",
			[]journalRecord{{Kind: "check", At: "t"}}, nil, false},
		{"non-breaking space is not JSON whitespace", "\u00a0{\"kind\":\"a\",\"at\":\"t\"}\n", nil,
			[]badLine{{1, "not JSON"}}, false},
		{"blank lines counted", "\n\n{\"kind\":\"a\",\"at\":\"t\"}\n", []journalRecord{{Kind: "a", At: "t"}},
			[]badLine{{1, "empty line"}, {2, "empty line"}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs, bad, torn := readJournalLines(t, []byte(tt.data))
			if diff := cmp.Diff(tt.recs, recs, cmp.AllowUnexported(journalRecord{})); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.bad, bad); diff != "" {
				t.Errorf("bad lines (-want +got):\n%s", diff)
			}
			if torn != tt.torn {
				t.Errorf("torn = %v, want %v", torn, tt.torn)
			}
		})
	}
}

func FuzzJournalLines(f *testing.F) {
	f.Add([]byte(""))
	f.Add([]byte("{\"kind\":\"retire\",\"at\":\"2025-01-01T00:00:00.000Z\",\"subscription_id\":\"sub_1\"}\n{\"kind\""))
	f.Add([]byte("{\"kind\":\"route_change\",\"at\":\"t\",\"alias\":\"best\",\"from\":null,\"to\":\"a/b\",\"by\":\"cli\"}\n"))
	f.Add([]byte("{\"kind\":\"check\",\"at\":\"t\",\"score\":0.5,\"attempted\":3}\n\n[1]\n{\"KIND\":\"x\"}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, bad, torn := readJournalLines(t, data)
		lines := bytes.Count(data, []byte("\n"))
		prev := 0
		for _, b := range bad {
			if b.Line <= prev || b.Line > lines {
				t.Fatalf("bad line %d after %d, %d complete lines", b.Line, prev, lines)
			}
			if b.Reason == "" {
				t.Fatalf("bad line %d has no reason", b.Line)
			}
			prev = b.Line
		}
		if len(recs)+len(bad) != lines {
			t.Fatalf("%d records + %d bad lines != %d complete lines", len(recs), len(bad), lines)
		}
		if wantTorn := len(data) > 0 && data[len(data)-1] != '\n'; torn != wantTorn {
			t.Fatalf("torn = %v, want %v", torn, wantTorn)
		}
		for _, r := range recs {
			line, err := json.Marshal(r)
			if err != nil {
				t.Fatalf("accepted record does not marshal: %v", err)
			}
			again, bad, torn := readJournalLines(t, append(line, '\n'))
			if len(bad) != 0 || torn || len(again) != 1 {
				t.Fatalf("re-encoded record %s does not parse: %v", line, bad)
			}
			if diff := cmp.Diff(r, again[0], cmp.AllowUnexported(journalRecord{})); diff != "" {
				t.Fatalf("round trip changed the record (-read +reparsed):\n%s", diff)
			}
		}
	})
}
