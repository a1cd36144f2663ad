// Command bench is the load generator of examples/bench/run. In one run it
// sends the same chat request to a provider directly and through Brama and
// prints the throughput ratio and the latency Brama adds; with -floor it then
// compares Brama's gateway CPU per request with a bare reverse proxy's (the
// floor, served by this command with -serve-floor) in interleaved rounds.
// It exits 1 when the ratio is below -min-ratio or a CPU bound is exceeded
// (SPEC §13, issue 8).
package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

func main() {
	serve := flag.String("serve-floor", "", "serve the floor on `ADDR` instead of measuring")
	upstream := flag.String("upstream", "", "with -serve-floor: the provider's base `URL`")
	direct := flag.String("direct", "", "the provider's base `URL` (it serves /v1/chat/completions)")
	gateway := flag.String("gateway", "", "Brama's base `URL`")
	floor := flag.String("floor", "", "the floor's base `URL`; with it the CPU rounds run")
	gatewayPid := flag.Int("gateway-pid", 0, "Brama's process id")
	floorPid := flag.Int("floor-pid", 0, "the floor's process id")
	n := flag.Int("n", 2000, "requests per throughput phase")
	c := flag.Int("c", 16, "concurrent requests in the throughput phases")
	stream := flag.Bool("stream", false, "ask for streamed answers in the throughput phases")
	minRatio := flag.Float64("min-ratio", 0.70, "exit 1 below this throughput ratio")
	rounds := flag.Int("rounds", 3, "interleaved CPU rounds (0: none)")
	cpuN := flag.Int("cpu-n", 4000, "requests per leg of a CPU round")
	cpuC := flag.Int("cpu-c", 64, "concurrent requests in the CPU rounds")
	clk := flag.Float64("clk-tck", 100, "clock ticks a second in /proc/<pid>/stat (getconf CLK_TCK)")
	maxBuffered := flag.Float64("max-buffered", 1.3, "exit 1 when Brama's CPU per same-format buffered request exceeds the floor's by more than this factor")
	maxStream := flag.Float64("max-stream", 1.5, "exit 1 when Brama's CPU per same-format stream exceeds the floor's by more than this factor")
	flag.Parse()
	if *serve != "" {
		serveFloor(*serve, *upstream)
		return
	}
	if *direct == "" || *gateway == "" {
		flag.Usage()
		os.Exit(2)
	}
	token := os.Getenv("BRAMA_TOKEN")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * max(*c, *cpuC)}}
	chat := "/v1/chat/completions"
	// Warm both paths so connection set-up is not measured.
	phase(client, *direct+chat, "", chatBody("stub-model", *stream), *c, *c)
	phase(client, *gateway+chat, token, chatBody("openai/stub-model", *stream), *c, *c)
	d := phase(client, *direct+chat, "", chatBody("stub-model", *stream), *n, *c)
	g := phase(client, *gateway+chat, token, chatBody("openai/stub-model", *stream), *n, *c)
	ratio := g.rps / d.rps
	fmt.Printf("direct:  %8.0f req/s  p50 %-10v p99 %v  (%d errors)\n", d.rps, d.p50, d.p99, d.errors)
	fmt.Printf("gateway: %8.0f req/s  p50 %-10v p99 %v  (%d errors)\n", g.rps, g.p50, g.p99, g.errors)
	fmt.Printf("throughput ratio %.2f; Brama adds p50 %v, p99 %v\n", ratio, g.p50-d.p50, g.p99-d.p99)
	ok := true
	if d.errors+g.errors > 0 || ratio < *minRatio {
		fmt.Printf("FAIL: ratio below %.2f or errors (direct: %v; gateway: %v)\n", *minRatio, d.firstErr, g.firstErr)
		ok = false
	}
	if *floor != "" && *rounds > 0 {
		run := cpuRun{client: client, rounds: *rounds, n: *cpuN, c: *cpuC, clk: *clk}
		f := target{name: "floor", base: *floor, token: os.Getenv("BENCH_FLOOR_TOKEN"), pid: *floorPid}
		b := target{name: "Brama", base: *gateway, token: token, pid: *gatewayPid}
		ok = run.compare(f, b, *maxBuffered, *maxStream) && ok
	}
	if !ok {
		os.Exit(1)
	}
}

type result struct {
	rps      float64
	p50, p99 time.Duration
	errors   int
	firstErr error // the first failed request's, for the report
}

// phase sends n requests with c in flight and measures them.
func phase(client *http.Client, url, token, body string, n, c int) result {
	lat := make([]time.Duration, n)
	var mu sync.Mutex // guards errors and firstErr
	var firstErr error
	errors := 0
	next := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				t0 := time.Now()
				if err := call(client, url, token, body, io.Discard); err != nil {
					mu.Lock()
					errors++
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
				lat[i] = time.Since(t0)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lat)
	return result{rps: float64(n) / elapsed.Seconds(), p50: lat[n/2], p99: lat[n*99/100], errors: errors, firstErr: firstErr}
}

// call sends one request and copies the answer to w; an answer other than
// 200 is an error with the head of its body.
func call(client *http.Client, url, token, body string, w io.Writer) error {
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		head, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return fmt.Errorf("status %d: %s", resp.StatusCode, head)
	}
	_, err = io.Copy(w, resp.Body)
	return err
}
