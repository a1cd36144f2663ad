package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestJournalTornRecordNeverBecomesHistory: a short write can leave a whole
// record without its newline (the append was refused, "not changed"). SPEC §9
// ignores that torn final line, and the next append must not turn it into
// history: it stays an unreadable line (README: "like any other").
func TestJournalTornRecordNeverBecomesHistory(t *testing.T) {
	j, _ := newTestJournal(t)
	first := `{"kind":"retire","at":"2025-01-01T00:00:00.000Z","subscription_id":"sub_1","reason":"r"}` + "\n"
	torn := `{"kind":"retire","at":"2025-01-01T00:00:01.000Z","subscription_id":"sub_2","reason":"r"}`
	writeJournalFile(t, j, first+torn)
	if got, err := j.retired(); err != nil || !cmp.Equal(got, map[string]bool{"sub_1": true}) {
		t.Fatalf("retired with the torn tail = %v, %v; want only sub_1", got, err)
	}

	if err := j.append(journalRecord{Kind: "reinstate", SubscriptionID: "sub_1", Reason: "back"}); err != nil {
		t.Fatal(err)
	}
	if got, err := j.retired(); err != nil || len(got) != 0 {
		t.Errorf("retired after the next append = %v, %v; the torn retire of sub_2 became history", got, err)
	}
	var out bytes.Buffer
	ok, err := checkJournal(j, &out)
	if err != nil || ok || !strings.HasPrefix(out.String(), "line 2: ") {
		t.Errorf("journal check after the next append = %v, %v, %q; want line 2 reported", ok, err, out.String())
	}
	recs, _ := j.read()
	if len(recs) != 2 || recs[1].Kind != "reinstate" {
		t.Errorf("records after the append = %+v; want the first retire and the reinstate", recs)
	}
}
