// Command mutants finds statements of Brama's package that no test notices
// when they are gone: the tests that would still pass if a behaviour were
// removed.
//
// Each statement of the chosen kinds (if, loop, switch, call, assign (not
// :=), incdec, defer, go) in the chosen non-test files is a mutant: the
// statement replaced by nothing. Rather than compile once per mutant, it
// compiles the test binary once with every mutant guarded (`if mutID != N
// { S }`, the mutant schemata technique), dropping the mutants the compiler
// refuses (deleting them would not compile: verdict "compile"). Per-test
// coverage names the tests that run each mutant's lines; those tests run
// with MUTID=N, fail-fast. Verdicts, one tab-separated line per mutant:
// killed, SURVIVED (the covering tests all pass), UNCOVERED (no test runs
// it), compile. Every survivor is a test to write or a line to delete. A
// mutant that loses the state directory writes state files where the tests
// run: see git status afterwards.
//
// It takes about a second per mutant on two cores (the whole package: some
// 1,900 mutants), so it is not part of CI. Run it from the repository root,
// in the foreground or under setsid, never nohup (TESTING.md says why):
//
//	go run ./.ci/mutants -kinds if,loop,switch -files registry.go > mutants.tsv
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// mutant is one statement: its file, byte span, lines and kind.
type mutant struct {
	file                   string
	start, end, line, last int
	kind, text             string
}

func main() {
	files := flag.String("files", "", "comma-separated non-test `files` to mutate (default: all)")
	kinds := flag.String("kinds", "", "comma-separated statement `kinds` (default: all)")
	jobs := flag.Int("j", 2, "test binaries run at once")
	timeout := flag.Duration("timeout", 60*time.Second, "a mutant's tests may run this long (a deadlock it makes counts as killed)")
	flag.Parse()
	if err := run(*files, *kinds, *jobs, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "mutants:", err)
		os.Exit(1)
	}
}

func run(files, kinds string, jobs int, timeout time.Duration) error {
	root, _ := os.Getwd()
	tmp, err := os.MkdirTemp("", "mutants")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	names := strings.Split(files, ",")
	if files == "" {
		all, _ := filepath.Glob("*.go")
		names = slices.DeleteFunc(all, func(n string) bool { return strings.HasSuffix(n, "_test.go") })
	}
	src, muts := map[string][]byte{}, []mutant(nil)
	for _, n := range names {
		if src[n], err = os.ReadFile(n); err != nil {
			return err
		}
		muts = append(muts, statements(n, src[n], kinds)...)
	}
	cover, err := coverage(tmp)
	if err != nil {
		return err
	}
	bin, alive, err := compile(root, tmp, names, src, muts)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	report := func(m mutant, verdict string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf("%s\t%s:%d-%d\t%s\t%s\n", verdict, m.file, m.line, m.last, m.kind, m.text)
	}
	next, wg := make(chan int), sync.WaitGroup{}
	for range jobs {
		wg.Go(func() {
			for i := range next {
				m, tests := muts[i], map[string]bool{}
				for l := m.line; l <= m.last; l++ {
					for t := range cover[fmt.Sprint(m.file, ":", l)] {
						tests[t] = true
					}
				}
				if len(tests) == 0 {
					report(m, "UNCOVERED")
					continue
				}
				pattern := "^(" + strings.Join(slices.Sorted(func(yield func(string) bool) {
					for t := range tests {
						yield(t)
					}
				}), "|") + ")$"
				c := exec.Command(bin, "-test.count=1", "-test.failfast", "-test.timeout="+timeout.String(), "-test.run", pattern)
				c.Env = append(os.Environ(), fmt.Sprintf("MUTID=%d", i))
				report(m, map[bool]string{true: "killed", false: "SURVIVED"}[c.Run() != nil])
			}
		})
	}
	for i, m := range muts {
		if !alive[i] {
			report(m, "compile")
			continue
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return nil
}

// statements lists the mutants of one file: every statement of a kind asked for, in any block.
func statements(name string, b []byte, kinds string) (out []mutant) {
	fs := token.NewFileSet()
	f, err := parser.ParseFile(fs, name, b, 0)
	if err != nil {
		panic(err)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		blk, ok := n.(*ast.BlockStmt)
		if !ok {
			return true
		}
		for _, s := range blk.List {
			kind := map[string]string{"*ast.IfStmt": "if", "*ast.ExprStmt": "call", "*ast.AssignStmt": "assign",
				"*ast.IncDecStmt": "incdec", "*ast.DeferStmt": "defer", "*ast.GoStmt": "go", "*ast.RangeStmt": "loop",
				"*ast.ForStmt": "loop", "*ast.SwitchStmt": "switch", "*ast.TypeSwitchStmt": "switch"}[fmt.Sprintf("%T", s)]
			if a, ok := s.(*ast.AssignStmt); ok && a.Tok == token.DEFINE || kind == "" ||
				kinds != "" && !strings.Contains(","+kinds+",", ","+kind+",") {
				continue
			}
			p, e := fs.Position(s.Pos()), fs.Position(s.End())
			first, _, _ := strings.Cut(string(b[p.Offset:e.Offset]), "\n")
			out = append(out, mutant{name, p.Offset, e.Offset, p.Line, e.Line, kind, strings.TrimSpace(first)})
		}
		return true
	})
	return out
}

// coverage runs each test alone with a coverage profile: file:line → the tests that run it.
func coverage(tmp string) (map[string]map[string]bool, error) {
	bin := filepath.Join(tmp, "cover.test")
	if out, err := exec.Command("go", "test", "-c", "-cover", "-coverpkg=.", "-o", bin, ".").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%v: %s", err, out)
	}
	list, err := exec.Command(bin, "-test.list", "^(Test|Fuzz)").Output()
	if err != nil {
		return nil, err
	}
	cover, prof := map[string]map[string]bool{}, filepath.Join(tmp, "cover.out")
	for _, t := range strings.Fields(string(list)) {
		exec.Command(bin, "-test.count=1", "-test.timeout=120s", "-test.run", "^"+t+"$", "-test.coverprofile="+prof).Run()
		f, err := os.Open(prof)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() { // brama/file.go:l1.c1,l2.c2 statements count
			var l1, c1, l2, c2, n, count int
			path, span, _ := strings.Cut(sc.Text(), ":")
			if _, err := fmt.Sscanf(span, "%d.%d,%d.%d %d %d", &l1, &c1, &l2, &c2, &n, &count); err != nil || count == 0 {
				continue
			}
			for l := l1; l <= l2; l++ {
				key := fmt.Sprint(filepath.Base(path), ":", l)
				if cover[key] == nil {
					cover[key] = map[string]bool{}
				}
				cover[key][t] = true
			}
		}
		f.Close()
	}
	return cover, nil
}

// compile builds the test binary with every alive mutant guarded, through a go build overlay (the files stay
// as they are); a mutant the compiler refuses (its deletion would not compile) is dropped and it builds again.
func compile(root, tmp string, names []string, src map[string][]byte, muts []mutant) (string, []bool, error) {
	alive := make([]bool, len(muts))
	for i := range alive {
		alive[i] = true
	}
	bin, overlay := filepath.Join(tmp, "mutants.test"), map[string]string{}
	overlay[filepath.Join(root, "mutid.go")] = filepath.Join(tmp, "mutid.go")
	os.WriteFile(filepath.Join(tmp, "mutid.go"), []byte("package main\n\nimport (\n\t\"os\"\n\t\"strconv\"\n)\n\n"+
		"var mutID, _ = strconv.Atoi(os.Getenv(\"MUTID\"))\n"), 0o644)
	for {
		for _, n := range names {
			var b []byte
			last := 0
			type cut struct {
				at   int
				text string
			}
			var cuts []cut
			for i, m := range muts {
				if m.file == n && alive[i] {
					cuts = append(cuts, cut{m.start, fmt.Sprintf("if mutID != %d {", i)}, cut{m.end, "}"})
				}
			}
			slices.SortStableFunc(cuts, func(a, b cut) int { return a.at - b.at })
			for _, c := range cuts { // on the statement's own lines: line numbers stay
				b, last = append(append(b, src[n][last:c.at]...), c.text...), c.at
			}
			overlay[filepath.Join(root, n)] = filepath.Join(tmp, n)
			os.WriteFile(filepath.Join(tmp, n), append(b, src[n][last:]...), 0o644)
		}
		ov, _ := json.Marshal(map[string]any{"Replace": overlay})
		os.WriteFile(filepath.Join(tmp, "overlay.json"), ov, 0o644)
		out, err := exec.Command("go", "test", "-overlay", filepath.Join(tmp, "overlay.json"), "-gcflags=-e", "-c", "-o", bin, ".").CombinedOutput()
		if err == nil {
			return bin, alive, nil
		}
		dropped := 0
		for _, l := range strings.Split(string(out), "\n") { // FILE:LINE:COL: message
			parts, line := strings.SplitN(l, ":", 4), 0
			if len(parts) == 4 {
				fmt.Sscan(parts[1], &line)
			}
			if line == 0 {
				continue
			}
			file, best := filepath.Base(parts[0]), -1
			for i, m := range muts {
				if !alive[i] || m.file != file {
					continue
				} else if strings.Contains(l, "missing return") { // at the closing brace: the function's last statement, outermost
					if m.last < line && (best < 0 || m.last > muts[best].last || m.last == muts[best].last && m.line < muts[best].line) {
						best = i
					}
				} else if m.line <= line && line <= m.last && (best < 0 || m.last-m.line < muts[best].last-muts[best].line) {
					best = i // the innermost holding the error
				}
			}
			if best >= 0 {
				alive[best], dropped = false, dropped+1
			}
		}
		if dropped == 0 {
			return "", nil, fmt.Errorf("the guarded package does not compile: %s", out)
		}
	}
}
