package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

// TestFloor shows the floor is the proxy it claims to be: it refuses a
// caller without its bearer token before any upstream call, sends the
// provider key instead of the caller's token, and relays a stream event by
// event (the upstream sends its second event only after the caller has read
// the first).
func TestFloor(t *testing.T) {
	next := make(chan struct{})
	seen := make(chan string, 8) // one line a call: Authorization, path, body
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seen <- fmt.Sprintf("%s %s %s", r.Header.Get("Authorization"), r.URL.Path, b)
		if !strings.Contains(string(b), `"stream":true`) {
			io.WriteString(w, `{"answer":1}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		<-next
		io.WriteString(w, "data: 2\n\n")
	}))
	defer up.Close()
	h, err := newFloor(up.URL, "floor-token", "sk-upstream")
	if err != nil {
		t.Fatal(err)
	}
	floor := httptest.NewServer(h)
	defer floor.Close()
	client := &http.Client{Timeout: 10 * time.Second}
	post := func(auth, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("POST", floor.URL+"/v1/chat/completions", strings.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	for _, auth := range []string{"", "Bearer wrong", "bearer floor-token", "Bearer floor-token2", "floor-token"} {
		resp := post(auth, `{"stream":false}`)
		resp.Body.Close()
		if resp.StatusCode != 401 || len(seen) != 0 {
			t.Errorf("Authorization %q: status %d after %d upstream calls, want 401 and none", auth, resp.StatusCode, len(seen))
		}
	}

	resp := post("Bearer floor-token", `{"stream":false}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != `{"answer":1}` {
		t.Errorf("buffered: %d %q, want 200 and the upstream's answer", resp.StatusCode, b)
	}
	if got := <-seen; got != `Bearer sk-upstream /v1/chat/completions {"stream":false}` {
		t.Errorf("upstream got %q, want the provider key, the caller's path and body", got)
	}

	resp = post("Bearer floor-token", `{"stream":true}`)
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	if line, err := r.ReadString('\n'); line != "data: 1\n" {
		t.Fatalf("first event line %q (%v) before the upstream sent the second", line, err)
	}
	close(next)
	rest, _ := io.ReadAll(r)
	if string(rest) != "\ndata: 2\n\n" {
		t.Errorf("rest of the stream %q", rest)
	}
}

func TestNewFloorRefusesBadSetup(t *testing.T) {
	for _, tc := range []struct{ upstream, token string }{
		{"", "t"}, {"not a url", "t"}, {"http://127.0.0.1:1", ""},
	} {
		if _, err := newFloor(tc.upstream, tc.token, "k"); err == nil {
			t.Errorf("newFloor(%q, %q) accepted", tc.upstream, tc.token)
		}
	}
}

func TestParseStat(t *testing.T) {
	tail := " S 1 2 3 4 5 6 7 8 9 10 %s %s 13 14 15 16 17 18 19 20\n"
	for _, tc := range []struct {
		line string
		want int64 // -1: an error
	}{
		{"42 (brama)" + fmt.Sprintf(tail, "150", "30"), 180},
		{"42 (a b) (c))" + fmt.Sprintf(tail, "7", "0"), 7},
		{"42 (brama)" + fmt.Sprintf(tail, "x", "30"), -1},
		{"42 (brama)" + fmt.Sprintf(tail, "-1", "30"), -1},
		{"42 (brama) S 1 2 3", -1},
		{"42 brama S 1 2 3 4 5 6 7 8 9 10 11 12 13", -1},
		{"", -1},
	} {
		got, err := parseStat([]byte(tc.line))
		if tc.want < 0 && err == nil {
			t.Errorf("parseStat(%q) = %d, want an error", tc.line, got)
		}
		if tc.want >= 0 && (err != nil || got != tc.want) {
			t.Errorf("parseStat(%q) = %d, %v, want %d", tc.line, got, err, tc.want)
		}
	}
	if _, err := cpuTicks(os.Getpid()); err != nil {
		t.Errorf("cpuTicks of this process: %v", err)
	}
}

// FuzzParseStat: any input parses or errs without a panic, and a stat line
// with any command name yields the sum of its utime and stime.
func FuzzParseStat(f *testing.F) {
	f.Fuzz(func(t *testing.T, name string, utime, stime uint32) {
		parseStat([]byte(name))
		line := fmt.Sprintf("9 (%s) R 1 2 3 4 5 6 7 8 9 10 %d %d 13 14", name, utime, stime)
		got, err := parseStat([]byte(line))
		if err != nil || got != int64(utime)+int64(stime) {
			t.Errorf("parseStat(%q) = %d, %v, want %d", line, got, err, int64(utime)+int64(stime))
		}
	})
}
