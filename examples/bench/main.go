// Command bench is a small load generator for examples/bench/run. It sends
// the same chat request to a provider directly and through Brama, in the
// same run, and prints the throughput ratio and the latency Brama adds.
// It exits 1 when the ratio is below -min-ratio (SPEC §13).
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
	direct := flag.String("direct", "", "provider chat `URL` (…/chat/completions)")
	gateway := flag.String("gateway", "", "Brama chat `URL` (…/v1/chat/completions)")
	token := flag.String("token", os.Getenv("BRAMA_TOKEN"), "Brama bearer token (default $BRAMA_TOKEN)")
	n := flag.Int("n", 2000, "requests per phase")
	c := flag.Int("c", 16, "concurrent requests")
	stream := flag.Bool("stream", false, "ask for a streamed answer")
	minRatio := flag.Float64("min-ratio", 0.70, "exit 1 below this throughput ratio")
	flag.Parse()
	if *direct == "" || *gateway == "" {
		flag.Usage()
		os.Exit(2)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *c * 2}}
	body := func(model string) string {
		return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"stream":%v}`, model, *stream)
	}
	// Warm both paths so connection set-up is not measured.
	phase(client, *direct, "", body("stub-model"), *c, *c)
	phase(client, *gateway, *token, body("openai/stub-model"), *c, *c)
	d := phase(client, *direct, "", body("stub-model"), *n, *c)
	g := phase(client, *gateway, *token, body("openai/stub-model"), *n, *c)
	ratio := g.rps / d.rps
	fmt.Printf("direct:  %8.0f req/s  p50 %-10v p99 %v  (%d errors)\n", d.rps, d.p50, d.p99, d.errors)
	fmt.Printf("gateway: %8.0f req/s  p50 %-10v p99 %v  (%d errors)\n", g.rps, g.p50, g.p99, g.errors)
	fmt.Printf("throughput ratio %.2f; Brama adds p50 %v, p99 %v\n", ratio, g.p50-d.p50, g.p99-d.p99)
	if d.errors+g.errors > 0 || ratio < *minRatio {
		fmt.Printf("FAIL: ratio below %.2f or errors\n", *minRatio)
		os.Exit(1)
	}
}

type result struct {
	rps      float64
	p50, p99 time.Duration
	errors   int
}

// phase sends n requests with c in flight and measures them.
func phase(client *http.Client, url, token, body string, n, c int) result {
	lat := make([]time.Duration, n)
	var mu sync.Mutex // guards errors
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
				req, _ := http.NewRequest("POST", url, strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if token != "" {
					req.Header.Set("Authorization", "Bearer "+token)
				}
				resp, err := client.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				if err != nil {
					mu.Lock()
					errors++
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
	return result{rps: float64(n) / elapsed.Seconds(), p50: lat[n/2], p99: lat[n*99/100], errors: errors}
}
