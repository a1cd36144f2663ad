// Command docs checks that TESTING.md accounts for every supported outcome
// (issue 12): every error code of journal.go's code table and every rule the
// seed page states has a row, and every example script and test a row
// names exists. It prints one line per finding and exits 1 when there is
// any. Run it from the repository root: go run ./.ci/docs
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// seedRules are the outcomes the seed page and SPEC state that TESTING.md
// must tie to evidence, each matched in a row's first cell, ignoring case.
var seedRules = []string{
	"one attempt on a direct route",
	"at most two attempts on a subscription route",
	"selectors skip a refused pool",
	"a committed stream is never retried",
	"no elapsed-time cutoff",
	"oauth partial 401 is a transport failure",
	"refresh only at ledger moments",
	"no-home refusals",
	"replay guard",
	"passthrough",
	"alias state `serving`",
	"alias state `no_route`",
	"alias state `capability_absent`",
	"alias state `routes_file_invalid`",
}

func main() {
	dir := flag.String("dir", ".", "the repository root")
	flag.Parse()
	findings, err := check(*dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "docs:", err)
		os.Exit(2)
	}
	for _, f := range findings {
		fmt.Println(f)
	}
	if len(findings) > 0 {
		os.Exit(1)
	}
}

// row is one line of a TESTING.md table: outcome, example, test, how to run.
type row struct {
	line  int
	cells []string
}

var (
	backticked = regexp.MustCompile("`([^`]+)`")
	testName   = regexp.MustCompile(`^(Test|Fuzz|Benchmark)[A-Za-z0-9_]*$`)
)

func check(dir string) ([]string, error) {
	codes, err := codeTable(filepath.Join(dir, "journal.go"))
	if err != nil {
		return nil, err
	}
	tests, err := testFunctions(dir)
	if err != nil {
		return nil, err
	}
	checks, err := clientChecks(dir)
	if err != nil {
		return nil, err
	}
	rows, err := tableRows(filepath.Join(dir, "TESTING.md"))
	if err != nil {
		return nil, err
	}

	var findings []string
	covered := func(want string, code bool) bool {
		for _, r := range rows {
			first := strings.ToLower(r.cells[0])
			if code {
				for _, m := range backticked.FindAllStringSubmatch(r.cells[0], -1) {
					if m[1] == want {
						return true
					}
				}
			} else if strings.Contains(first, want) {
				return true
			}
		}
		return false
	}
	for _, c := range codes {
		if !covered(c, true) {
			findings = append(findings, fmt.Sprintf("TESTING.md: error code %s has no row", c))
		}
	}
	for _, rule := range seedRules {
		if !covered(rule, false) {
			findings = append(findings, fmt.Sprintf("TESTING.md: seed rule %q has no row", rule))
		}
	}
	for _, r := range rows {
		if len(r.cells) < 3 {
			findings = append(findings, fmt.Sprintf("TESTING.md:%d: a row needs outcome, example and test cells", r.line))
			continue
		}
		for _, m := range backticked.FindAllStringSubmatch(r.cells[1], -1) {
			if _, err := os.Stat(filepath.Join(dir, m[1])); err != nil {
				findings = append(findings, fmt.Sprintf("TESTING.md:%d: example %s does not exist", r.line, m[1]))
			}
		}
		named := 0
		for _, m := range backticked.FindAllStringSubmatch(r.cells[2], -1) {
			name := m[1]
			switch {
			case testName.MatchString(name):
				named++
				if !tests[name] {
					findings = append(findings, fmt.Sprintf("TESTING.md:%d: test %s does not exist", r.line, name))
				}
			case strings.HasPrefix(name, "clients:"):
				named++
				check := strings.TrimPrefix(name, "clients:")
				if !checks[check] {
					findings = append(findings, fmt.Sprintf("TESTING.md:%d: examples/clients check %s does not exist", r.line, check))
				}
			}
		}
		if named == 0 {
			findings = append(findings, fmt.Sprintf("TESTING.md:%d: the row names no test that proves it", r.line))
		}
	}
	pages, err := pageFindings(dir)
	if err != nil {
		return nil, err
	}
	findings = append(findings, pages...)
	sort.Strings(findings)
	return findings, nil
}

var (
	mdLink   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	repoFile = regexp.MustCompile(`^(?:(?:examples|testdata|\.ci)/[A-Za-z0-9_./-]+|[A-Za-z0-9_-]+\.(?:md|go))$`)
	heading  = regexp.MustCompile(`^#+ (.*)$`)
	mdName   = regexp.MustCompile(`\b[A-Z][A-Za-z_-]*\.md\b`)
)

// pageFindings checks every Markdown page at the repository's root: a link
// or a backticked file name names a file the repository holds (and a link's
// #anchor a heading of that page), and every sh block is run by a script
// its section names (an examples/ script, or .ci/run).
func pageFindings(dir string) ([]string, error) {
	pages, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		return nil, err
	}
	anchors := map[string]map[string]bool{}
	texts := map[string][]string{}
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		name := filepath.Base(p)
		texts[name] = strings.Split(string(b), "\n")
		anchors[name] = map[string]bool{}
		for _, l := range texts[name] {
			if m := heading.FindStringSubmatch(l); m != nil {
				anchors[name][slug(m[1])] = true
			}
		}
	}
	exists := func(f string) bool { _, err := os.Stat(filepath.Join(dir, f)); return err == nil }
	var findings []string
	for name, lines := range texts {
		fenced, section, intro := false, "", ""
		for i, l := range lines {
			if strings.HasPrefix(l, "```") {
				if !fenced && strings.TrimPrefix(l, "```") == "sh" && !runs(intro+section) {
					findings = append(findings, fmt.Sprintf("%s:%d: an sh block whose section names no examples/ script that runs it", name, i+1))
				}
				fenced = !fenced
				continue
			}
			if fenced {
				continue
			}
			if heading.MatchString(l) {
				if intro == "" && strings.HasPrefix(l, "## ") {
					intro = section
				}
				section = ""
			}
			section += l + "\n"
			for _, m := range mdLink.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				if file == "" {
					file = name
				}
				if !exists(file) {
					findings = append(findings, fmt.Sprintf("%s:%d: link to %s, which the repository does not hold", name, i+1, file))
				} else if anchor != "" && anchors[file] != nil && !anchors[file][anchor] {
					findings = append(findings, fmt.Sprintf("%s:%d: link to %s#%s, a heading that page does not have", name, i+1, file, anchor))
				}
			}
			for _, f := range mdName.FindAllString(l, -1) {
				if !exists(f) {
					findings = append(findings, fmt.Sprintf("%s:%d: names %s, which the repository does not hold", name, i+1, f))
				}
			}
			for _, m := range backticked.FindAllStringSubmatch(l, -1) {
				if f := strings.TrimSuffix(m[1], "/"); repoFile.MatchString(f) && !strings.ContainsAny(f, "*<>") && !exists(f) {
					findings = append(findings, fmt.Sprintf("%s:%d: names %s, which the repository does not hold", name, i+1, f))
				}
			}
		}
	}
	return findings, nil
}

// runs says whether a section's text names the script that runs its blocks.
func runs(text string) bool {
	return strings.Contains(text, "`examples/") || strings.Contains(text, "`.ci/run`")
}

// slug is a heading's anchor as GitHub makes it.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// codeTable is the keys of journal.go's `codes` map: the one code table.
func codeTable(path string) ([]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		return nil, err
	}
	var codes []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "codes" || len(vs.Values) != 1 {
			return true
		}
		lit, ok := vs.Values[0].(*ast.CompositeLit)
		if !ok {
			return true
		}
		for _, e := range lit.Elts {
			if kv, ok := e.(*ast.KeyValueExpr); ok {
				if bl, ok := kv.Key.(*ast.BasicLit); ok {
					if s, err := strconv.Unquote(bl.Value); err == nil {
						codes = append(codes, s)
					}
				}
			}
		}
		return false
	})
	if len(codes) == 0 {
		return nil, fmt.Errorf("%s declares no codes table", path)
	}
	return codes, nil
}

// testFunctions is every Test, Fuzz and Benchmark function the package's
// test files declare.
func testFunctions(dir string) (map[string]bool, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	tests := map[string]bool{}
	for _, name := range names {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && testName.MatchString(fd.Name.Name) {
				tests[fd.Name.Name] = true
			}
		}
	}
	return tests, nil
}

// clientChecks is the names examples/clients/run -list prints: the
// real-client checks a row may cite as clients:NAME.
func clientChecks(dir string) (map[string]bool, error) {
	names := map[string]bool{}
	run := filepath.Join(dir, "examples", "clients", "run")
	if _, err := os.Stat(run); os.IsNotExist(err) {
		return names, nil
	}
	out, err := exec.Command("bash", run, "-list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s -list: %w", run, err)
	}
	for _, n := range strings.Fields(string(out)) {
		names[n] = true
	}
	return names, nil
}

// tableRows is every table row of TESTING.md but header and separator rows.
func tableRows(path string) ([]row, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rows []row
	header := true
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			header = true
			continue
		}
		if header { // the first line of each table names its columns
			header = false
			continue
		}
		if strings.Trim(line, "|-: ") == "" {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		rows = append(rows, row{line: i + 1, cells: cells})
	}
	return rows, nil
}
