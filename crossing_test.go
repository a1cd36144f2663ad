package main

import (
	"net"
	"testing"
)

// Tests of what crosses Brama besides the body: transport, headers each way.

// A trusted proxy sets one forwarded header and passes the other on as the
// client wrote it, so a client on plain HTTP that forges the other one must
// still get 426: every header naming a proto must say https (SPEC §3.3).
func TestTrustedProxyForgedProto(t *testing.T) {
	ip := nonLoopbackIP()
	if ip == "" {
		t.Skip("no non-loopback interface: TestTransportGuard covers the rule without HTTP")
	}
	env := stateEnv(t)
	env["BRAMA_TRUSTED_PROXY_IPS"] = ip
	d := startDaemon(t, env, "", "-addr", net.JoinHostPort(ip, "0"))
	tests := []struct {
		name string
		hdr  []string
		want int
	}{
		{"the proxy's http beside a forged Forwarded https", []string{"X-Forwarded-Proto", "http", "Forwarded", "proto=https"}, 426},
		{"the proxy's Forwarded http beside a forged https", []string{"X-Forwarded-Proto", "https", "Forwarded", "for=192.0.2.9;proto=http"}, 426},
		{"no forwarded header", nil, 426},
		{"https", []string{"X-Forwarded-Proto", "https"}, 200},
		{"both https", []string{"X-Forwarded-Proto", "https", "Forwarded", `for=192.0.2.9;proto="https"`}, 200},
		{"Forwarded https, its element naming no proto", []string{"Forwarded", "proto=https, for=192.0.2.9"}, 426},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, _, body := d.call("GET", "/v1/aliases", d.token, "", tc.hdr...)
			if status != tc.want {
				t.Fatalf("status %d, want %d: %s", status, tc.want, body)
			}
			if tc.want == 426 {
				if e := envelopeOf(t, body); e["code"] != "secure_transport_required" {
					t.Errorf("refusal %v, want secure_transport_required", e)
				}
			}
		})
	}
}
