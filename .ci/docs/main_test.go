package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheck builds a small repository and shows the check passing on it,
// then failing for each kind of gap it exists to catch.
func TestCheck(t *testing.T) {
	const journalGo = "package main\n\nvar codes = map[string]int{\n\t\"invalid_request\": 400,\n\t\"not_found\": 404,\n}\n"
	const testGo = "package main\n\nimport \"testing\"\n\nfunc TestRefusals(t *testing.T) {}\n"
	complete := "| outcome | example | test | run |\n|---|---|---|---|\n" +
		"| `invalid_request` | `examples/12-refusals.sh` | `TestRefusals` | `go test -run TestRefusals .` |\n" +
		"| `not_found` | — | `clients:openai-sdk-404` | `examples/clients/run openai-sdk-404` |\n"
	for _, rule := range seedRules {
		complete += "| " + rule + " | — | `TestRefusals` | |\n"
	}
	tests := []struct {
		name     string
		edit     func(md, errs string) (string, string)
		wantFind string
	}{
		{"complete", func(m, e string) (string, string) { return m, e }, ""},
		{"code without a row", func(m, e string) (string, string) {
			return m, strings.Replace(e, "}\n", "\t\"state_conflict\": 409,\n}\n", 1)
		}, "error code state_conflict has no row"},
		{"row naming a missing test", func(m, e string) (string, string) {
			return strings.Replace(m, "`TestRefusals` | `go", "`TestGone` | `go", 1), e
		}, "test TestGone does not exist"},
		{"row naming a missing example", func(m, e string) (string, string) {
			return strings.Replace(m, "examples/12-refusals.sh", "examples/99-gone.sh", 1), e
		}, "example examples/99-gone.sh does not exist"},
		{"row naming a missing client check", func(m, e string) (string, string) {
			return strings.Replace(m, "openai-sdk-404`", "openai-sdk-999`", 1), e
		}, "examples/clients check openai-sdk-999 does not exist"},
		{"seed rule without a row", func(m, e string) (string, string) {
			return strings.Replace(m, "| replay guard |", "| something else |", 1), e
		}, `seed rule "replay guard" has no row`},
		{"row naming no test", func(m, e string) (string, string) {
			return strings.Replace(m, "`clients:openai-sdk-404`", "by hand", 1), e
		}, "the row names no test that proves it"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			md, errs := tt.edit(complete, journalGo)
			write(t, dir, "journal.go", errs)
			write(t, dir, "refusals_test.go", testGo)
			write(t, dir, "TESTING.md", md)
			write(t, dir, "examples/12-refusals.sh", "#!/bin/sh\n")
			write(t, dir, "examples/clients/run", "[ \"$1\" = -list ] && printf '%s\\n' openai-sdk-404 refuse-openai-400\n")
			findings, err := check(dir)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(findings, "\n")
			if tt.wantFind == "" && got != "" {
				t.Fatalf("findings on a complete repository:\n%s", got)
			}
			if tt.wantFind != "" && !strings.Contains(got, tt.wantFind) {
				t.Fatalf("findings %q do not contain %q", got, tt.wantFind)
			}
		})
	}
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPageFindings shows the page check passing on a small repository,
// then failing for each kind of gap it exists to catch.
func TestPageFindings(t *testing.T) {
	const good = "# Page\n\nSee [the other](OTHER.md#a-heading) and [here](#page) and `examples/run.sh`.\n\n## Try\n\n`examples/run.sh` runs it:\n\n```sh\necho hi\n```\n"
	tests := []struct {
		name, page, want string
	}{
		{"complete", good, ""},
		{"link to a missing page", strings.Replace(good, "OTHER.md", "GONE.md", 1), "link to GONE.md"},
		{"link to a missing heading", strings.Replace(good, "#a-heading", "#nowhere", 1), "a heading that page does not have"},
		{"a missing file named", strings.Replace(good, "and `examples/run.sh`", "and `examples/gone.sh`", 1), "names examples/gone.sh"},
		{"a page named in text", good + "\nRead SPEC.md.\n", "names SPEC.md"},
		{"an sh block no script runs", strings.ReplaceAll(good, "`examples/run.sh`", "the script"), "an sh block whose section names no examples/ script"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, "PAGE.md", tt.page)
			write(t, dir, "OTHER.md", "# Other\n\n## A heading\n")
			write(t, dir, "examples/run.sh", "#!/bin/sh\n")
			findings, err := pageFindings(dir)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(findings, "\n")
			if tt.want == "" && got != "" || tt.want != "" && !strings.Contains(got, tt.want) {
				t.Fatalf("findings %q, want %q", got, tt.want)
			}
		})
	}
}
