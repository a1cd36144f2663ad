package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheck builds a small package that passes, then breaks it once for
// each rule the check exists for and shows the finding.
func TestCheck(t *testing.T) {
	files := map[string]string{
		"server.go":   "package main\n\nimport \"net/http\"\n\ntype server struct{ e engine }\n\nfunc (s *server) handle(w http.ResponseWriter, r *http.Request) { s.e.run() }\n\nfunc main() {}\n",
		"dispatch.go": "package main\n\nimport \"net/http\"\n\ntype engine struct{}\n\nfunc (e engine) run() { panic(http.ErrAbortHandler) }\n",
		// What the no-cutoff rule allows: idle bounds, a timeout set to 0, an abort now.
		"state.go": "package main\n\nimport (\n\t\"net/http\"\n\t\"time\"\n)\n\nvar srv = &http.Server{ReadHeaderTimeout: time.Second, IdleTimeout: time.Second}\n\n" +
			"func abort(w http.ResponseWriter) {\n\tt := &http.Transport{IdleConnTimeout: time.Second}\n\tt.TLSHandshakeTimeout = 0\n\thttp.NewResponseController(w).SetReadDeadline(time.Now())\n}\n",
		"README.md": "# x\n\n## Reading the code\n\n| rule | where |\n|---|---|\n| **a group of rules** | |\n| the abort | `(*engine).run`, `engine.run` |\n",
	}
	tests := []struct {
		name     string
		edit     func(map[string]string)
		wantFind string
	}{
		{"passes", func(map[string]string) {}, ""},
		{"a lower file uses a higher one's name", func(f map[string]string) {
			f["dispatch.go"] += "\nfunc (e engine) back(s *server) {}\n"
		}, "dispatch.go uses server of server.go, a higher layer"},
		{"a file with no layer", func(f map[string]string) {
			f["helpers.go"] = "package main\n"
		}, "helpers.go has no layer"},
		{"the abort written twice", func(f map[string]string) {
			f["dispatch.go"] += "\nfunc (e engine) again() { panic(http.ErrAbortHandler) }\n"
		}, "written 2 times"},
		{"a file over its limit", func(f map[string]string) {
			f["dispatch.go"] += strings.Repeat("\n", 40)
		}, "dispatch.go: "},
		{"a context deadline", func(f map[string]string) {
			f["dispatch.go"] += "\nfunc (e engine) wait() {\n\tctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)\n\tdefer cancel()\n\t<-ctx.Done()\n}\n"
			f["dispatch.go"] = strings.Replace(f["dispatch.go"], `import "net/http"`, "import (\n\t\"context\"\n\t\"net/http\"\n\t\"time\"\n)", 1)
		}, "context.WithTimeout is an elapsed-time cutoff"},
		{"time.After", func(f map[string]string) {
			f["dispatch.go"] += "\nfunc (e engine) wait() { <-time.After(time.Second) }\n"
			f["dispatch.go"] = strings.Replace(f["dispatch.go"], `import "net/http"`, "import (\n\t\"net/http\"\n\t\"time\"\n)", 1)
		}, "time.After is an elapsed-time cutoff"},
		{"a client Timeout", func(f map[string]string) {
			f["dispatch.go"] += "\nvar client = &http.Client{Timeout: 1}\n"
		}, "the Timeout field is an elapsed-time cutoff"},
		{"a transport's first-byte timeout, assigned", func(f map[string]string) {
			f["dispatch.go"] += "\nfunc (e engine) transport() { t := &http.Transport{}; t.ResponseHeaderTimeout = 1 }\n"
		}, "the ResponseHeaderTimeout field is an elapsed-time cutoff"},
		{"a server's ReadTimeout", func(f map[string]string) {
			f["dispatch.go"] += "\nvar srv2 = &http.Server{ReadTimeout: 1}\n"
		}, "the ReadTimeout field is an elapsed-time cutoff"},
		{"a read deadline later than now", func(f map[string]string) {
			f["dispatch.go"] += "\nfunc (e engine) read(w http.ResponseWriter) {\n\thttp.NewResponseController(w).SetReadDeadline(time.Now().Add(time.Second))\n}\n"
			f["dispatch.go"] = strings.Replace(f["dispatch.go"], `import "net/http"`, "import (\n\t\"net/http\"\n\t\"time\"\n)", 1)
		}, "SetReadDeadline is an elapsed-time cutoff"},
		{"README names a missing function", func(f map[string]string) {
			f["README.md"] = strings.Replace(f["README.md"], "`engine.run`", "`engine.gone`", 1)
		}, "README names engine.gone"},
		{"README without the rules table", func(f map[string]string) {
			f["README.md"] = "# x\n"
		}, `no "Reading the code" table`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := map[string]string{}
			for k, v := range files {
				f[k] = v
			}
			tt.edit(f)
			dir := t.TempDir()
			for name, content := range f {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			findings, err := check(dir, "README.md", 100, 30, 0)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(findings, "\n")
			if tt.wantFind == "" && got != "" {
				t.Fatalf("findings on a clean package:\n%s", got)
			}
			if tt.wantFind != "" && !strings.Contains(got, tt.wantFind) {
				t.Fatalf("findings %q do not contain %q", got, tt.wantFind)
			}
		})
	}
}
