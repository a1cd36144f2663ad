package main

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
)

// A target is a process that serves the load: the floor or Brama.
type target struct {
	name, base, token string
	pid               int
}

// A leg is one kind of request sent to one target in every round.
type leg struct {
	to         target
	path, body string
}

// A row compares Brama's leg with the floor's; a bound of 0 reports the
// ratio without bounding it.
type row struct {
	name         string
	brama, floor int // indexes into the legs
	bound        float64
}

// cpuRun is the gateway-CPU comparison: rounds interleaved rounds of every
// leg, n requests each with c in flight, read from /proc/<pid>/stat in
// clock ticks of clk a second.
type cpuRun struct {
	client       *http.Client
	rounds, n, c int
	clk          float64
}

// compare measures the floor and Brama side by side, prints the medians and
// ratios, and reports whether every bound holds.
func (run cpuRun) compare(floor, brama target, maxBuffered, maxStream float64) bool {
	messages := func(stream bool) string {
		return fmt.Sprintf(`{"model":"openai/stub-model","max_tokens":256,"messages":[{"role":"user","content":"hi"}],"stream":%v}`, stream)
	}
	legs := []leg{
		{floor, "/v1/chat/completions", chatBody("stub-model", false)},
		{brama, "/v1/chat/completions", chatBody("openai/stub-model", false)},
		{brama, "/v1/messages", messages(false)},
		{floor, "/v1/chat/completions", chatBody("stub-model", true)},
		{brama, "/v1/chat/completions", chatBody("openai/stub-model", true)},
		{brama, "/v1/messages", messages(true)},
	}
	rows := []row{
		{"chat → openai route, buffered (same format)", 1, 0, maxBuffered},
		{"chat → openai route, stream (same format)", 4, 3, maxStream},
		{"messages → openai route, buffered (translated)", 2, 0, 0},
		{"messages → openai route, stream (translated)", 5, 3, 0},
	}
	ok := true
	events := make([]int, len(legs))
	for i, l := range legs {
		var err error
		if events[i], err = run.sample(l); err != nil {
			fmt.Printf("FAIL: %s %s: %v\n", l.to.name, l.path, err)
			return false
		}
		phase(run.client, l.to.base+l.path, l.to.token, l.body, run.c, run.c) // warm the pools
	}
	perRequest := make([][]float64, len(legs)) // µs of gateway CPU, one a round
	for r := range run.rounds {
		for i, l := range legs {
			us, res, err := run.measure(l)
			if err == nil && res.errors > 0 {
				err = fmt.Errorf("%d requests failed, the first: %v", res.errors, res.firstErr)
			}
			if err != nil {
				fmt.Printf("FAIL: round %d, %s %s: %v\n", r+1, l.to.name, l.path, err)
				ok = false
			}
			perRequest[i] = append(perRequest[i], us)
		}
	}
	fmt.Printf("gateway CPU per request (user+system µs of the gateway process; median of %d interleaved rounds of %d requests, %d in flight):\n",
		run.rounds, run.n, run.c)
	fmt.Printf("  %-48s %7s %7s %7s  %s\n", "caller → route", "floor", "Brama", "ratio", "bound")
	for _, w := range rows {
		f, b := median(perRequest[w.floor]), median(perRequest[w.brama])
		bound := "none (reported only)"
		if w.bound > 0 {
			bound = fmt.Sprintf("≤ %.1f×", w.bound)
			if b > w.bound*f {
				bound += " FAIL"
				ok = false
			}
		}
		fmt.Printf("  %-48s %7.0f %7.0f %6.2f×  %s\n", w.name, f, b, b/f, bound)
	}
	fmt.Println("  each round (µs):")
	for _, w := range rows {
		fmt.Printf("  %-48s floor %s; Brama %s\n", w.name, joinRounds(perRequest[w.floor]), joinRounds(perRequest[w.brama]))
	}
	fmt.Printf("  events a caller receives per stream ([DONE] not counted): floor %d, Brama chat %d, Brama messages %d\n",
		events[3], events[4], events[5])
	return ok
}

// measure sends one leg's load and returns the target's CPU per request.
func (run cpuRun) measure(l leg) (us float64, res result, err error) {
	before, err := cpuTicks(l.to.pid)
	if err != nil {
		return 0, res, err
	}
	res = phase(run.client, l.to.base+l.path, l.to.token, l.body, run.n, run.c)
	after, err := cpuTicks(l.to.pid)
	return float64(after-before) / run.clk * 1e6 / float64(run.n), res, err
}

// sample sends one request of the leg and counts the SSE events of its
// answer but [DONE] (0 for a buffered answer).
func (run cpuRun) sample(l leg) (int, error) {
	var answer strings.Builder
	if err := call(run.client, l.to.base+l.path, l.to.token, l.body, &answer); err != nil {
		return 0, err
	}
	events := 0
	for line := range strings.Lines(answer.String()) {
		if strings.HasPrefix(line, "data:") && strings.TrimSpace(line[5:]) != "[DONE]" {
			events++
		}
	}
	return events, nil
}

// cpuTicks reads the user+system CPU of every thread of process pid so far,
// in clock ticks.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStat(b)
}

// parseStat reads fields 14 and 15 (utime, stime) of a /proc/<pid>/stat
// line and returns their sum.
func parseStat(b []byte) (int64, error) {
	// The command name (field 2, in parentheses) may hold spaces and
	// parentheses; the fields after its last ')' start with field 3.
	name := bytes.LastIndexByte(b, ')')
	if name < 0 {
		return 0, errors.New("a stat line without a command name")
	}
	fields := strings.Fields(string(b[name+1:]))
	if len(fields) < 15-2 {
		return 0, fmt.Errorf("a stat line of %d fields after the command name", len(fields))
	}
	utime, err1 := strconv.ParseInt(fields[14-3], 10, 64)
	stime, err2 := strconv.ParseInt(fields[15-3], 10, 64)
	if err1 != nil || err2 != nil || utime < 0 || stime < 0 {
		return 0, fmt.Errorf("a stat line with utime %q and stime %q", fields[14-3], fields[15-3])
	}
	return utime + stime, nil
}

// joinRounds prints one figure a round: "158 / 161 / 155".
func joinRounds(xs []float64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.FormatFloat(x, 'f', 0, 64)
	}
	return strings.Join(s, " / ")
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// chatBody is the chat request every chat leg sends.
func chatBody(model string, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"stream":%v}`, model, stream)
}
