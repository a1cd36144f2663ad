package main

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
)

// serveFloor serves the floor on addr: it prints "listening on http://ADDR"
// and serves until killed.
func serveFloor(addr, upstream string) {
	h, err := newFloor(upstream, os.Getenv("BENCH_FLOOR_TOKEN"), os.Getenv("BENCH_UPSTREAM_KEY"))
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("listening on http://%s\n", ln.Addr())
	log.Fatal(http.Serve(ln, h))
}

// newFloor is the floor Brama's gateway CPU is measured against: a bare
// httputil.ReverseProxy in front of upstream that checks the caller's bearer
// token, sends the provider key instead, keeps a pool of connections to
// upstream and flushes every write at once, as Brama flushes every stream
// event. It does no more: no parse, no route, no journal.
func newFloor(upstream, token, key string) (http.Handler, error) {
	target, err := url.Parse(upstream)
	if err != nil || target.Host == "" {
		return nil, fmt.Errorf("bench: -upstream %q is not a URL", upstream)
	}
	if token == "" {
		return nil, errors.New("bench: set BENCH_FLOOR_TOKEN to the token the floor accepts")
	}
	want := []byte("Bearer " + token)
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Header.Set("Authorization", "Bearer "+key)
		},
		Transport:     &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 512},
		FlushInterval: -1,
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			http.Error(w, `{"error":{"type":"authentication_error","message":"bad bearer token"}}`, http.StatusUnauthorized)
			return
		}
		// The transport may still read the request body after the answer's
		// headers are written; without full duplex the server has closed it
		// by then and the stream is cut (golang/go#40747).
		http.NewResponseController(w).EnableFullDuplex()
		proxy.ServeHTTP(w, r)
	}), nil
}
