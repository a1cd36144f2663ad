package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docSection is a page's text from the heading line to the next heading
// of the same or a higher level.
func docSection(t *testing.T, page, heading string) string {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("%s has no %q section", page, heading)
	}
	level, lines, fenced := len(strings.Fields(heading)[0]), strings.Split(rest, "\n"), false
	for i, line := range lines {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		if f := strings.Fields(line); !fenced && len(f) > 0 && strings.Trim(f[0], "#") == "" && len(f[0]) <= level {
			return strings.Join(lines[:i], "\n")
		}
	}
	return rest
}

// packageSources is each non-test Go file of the package, by name.
func packageSources(t *testing.T) map[string]string {
	files, _ := filepath.Glob("*.go")
	out := map[string]string{}
	for _, f := range files {
		if b, err := os.ReadFile(f); err != nil {
			t.Fatal(err)
		} else if !strings.HasSuffix(f, "_test.go") {
			out[f] = string(b)
		}
	}
	return out
}

// TestReadmeNamesEveryVariable: every BRAMA_* variable the code reads has
// its row in REFERENCE.md's environment table; a name built from a prefix
// (BRAMA_PROVIDER_<ID>_BASE_URL) has a row starting with that prefix.
func TestReadmeNamesEveryVariable(t *testing.T) {
	table := docSection(t, "REFERENCE.md", "### Environment")
	literal := regexp.MustCompile(`"(BRAMA_[A-Z_]+)"`)
	seen := map[string]bool{}
	for f, src := range packageSources(t) {
		for _, m := range literal.FindAllStringSubmatch(src, -1) {
			name := m[1]
			if seen[name] {
				continue
			}
			seen[name] = true
			row := "| `" + name + "` |"
			if strings.HasSuffix(name, "_") {
				row = "| `" + name + "<"
			}
			if !strings.Contains(table, row) {
				t.Errorf("%s reads %s; REFERENCE.md's environment table has no row for it", f, name)
			}
		}
	}
	if len(seen) < 10 {
		t.Errorf("found %d variable names in the code; the scan is broken", len(seen))
	}
}

// TestReadmeNamesEveryFlag: every command of the CLI table has a row in
// REFERENCE.md's CLI table (serve: the Running section too), that row names
// each flag its -h prints, and every row there names a command of the table.
func TestReadmeNamesEveryFlag(t *testing.T) {
	cli, running := docSection(t, "REFERENCE.md", "## CLI"), docSection(t, "REFERENCE.md", "## Running")
	rows := map[string]string{} // "routes list" → its row
	for _, line := range strings.Split(cli, "\n") {
		if cmd, ok := strings.CutPrefix(line, "| `brama "); ok {
			f := strings.Fields(cmd)
			words := f[:1]
			if len(f) > 1 && regexp.MustCompile(`^[a-z-]+$`).MatchString(strings.TrimRight(f[1], "`")) {
				words = []string{f[0], strings.TrimRight(f[1], "`")}
			}
			rows[strings.Trim(strings.Join(words, " "), "`")] = line
		}
	}
	flagName := regexp.MustCompile(`(?m)^  -([a-z-]+)`)
	for _, c := range commands() {
		row, ok := rows[c.name]
		if !ok {
			t.Errorf("REFERENCE.md's CLI table has no row for brama %s", c.name)
			continue
		}
		delete(rows, c.name)
		help, _, _ := runCLI(t, nil, "", append(strings.Fields(c.name), "-h")...)
		for _, m := range flagName.FindAllStringSubmatch(help, -1) {
			flag := "-" + m[1]
			if strings.Contains(row, flag+" ") || strings.Contains(row, flag+"]") || strings.Contains(row, flag+"`") {
				continue
			}
			if c.name == "serve" && strings.Contains(running, "`"+flag) {
				continue
			}
			if flag == "-gateway" && strings.Contains(cli, "`-gateway URL`") {
				continue // one sentence under the table names it for every command that calls the daemon
			}
			t.Errorf("brama %s -h prints %s; REFERENCE.md's row does not name it: %.100s", c.name, flag, row)
		}
	}
	for name := range rows {
		t.Errorf("REFERENCE.md's CLI table names brama %s, which the command table lacks", name)
	}
}

// TestReadmeNamesEveryLogEvent: every log message the code writes is named
// in REFERENCE.md's Logs section, by name or by a `family_*` pattern.
func TestReadmeNamesEveryLogEvent(t *testing.T) {
	logs := docSection(t, "AUTHORIZATION.md", "## Logs")
	event := regexp.MustCompile(`(?:\.(?:Info|Warn|Error|Debug)\(|slog\.Level[A-Za-z]+, |msg, level :?= )"([a-z]+(?:_[a-z]+)+)"`)
	family := regexp.MustCompile("`([a-z_]+_)\\*`")
	var families []string
	for _, m := range family.FindAllStringSubmatch(logs, -1) {
		families = append(families, m[1])
	}
	n := 0
	for f, src := range packageSources(t) {
		for _, m := range event.FindAllStringSubmatch(src, -1) {
			n++
			name := m[1]
			if strings.Contains(logs, "`"+name+"`") || slices.ContainsFunc(families, func(p string) bool { return strings.HasPrefix(name, p) }) {
				continue
			}
			t.Errorf("%s logs %q; REFERENCE.md's Logs section does not name it", f, name)
		}
	}
	if n < 30 {
		t.Errorf("found %d log calls; the scan is broken", n)
	}
}
