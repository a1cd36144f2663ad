// Command structure checks the shape of Brama's package (issue 11):
//
//   - a file uses only names defined in files of its own layer or below
//     (the layers of LAYOUT.md, in the table below); every non-test file
//     has a layer; -max-upward N allows N upward uses while the rewrite
//     (issue 20) moves code to where its layer says;
//   - the abort after a committed stream is written once;
//   - no elapsed-time cutoff (SPEC §7.4): no context deadline, time.After
//     or Tick, no …Timeout duration field set but to 0 (idle bounds aside),
//     and no Set…Deadline but an abort at time.Now();
//   - non-test Go stays within its line budget, no file over its limit;
//   - every function README's "Reading the code" table names exists.
//
// It parses and type-checks the package with go/parser and go/types, and
// prints one line per finding; it exits 1 when there is any. Run it from
// the repository root: go run ./.ci/structure
package main

import (
	"bufio"
	"flag"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// layers are the package's files by layer, lowest first (LAYOUT.md): a file
// may use names of its own layer and the layers below, never above.
var layers = [][]string{
	{"state", "journal"}, // ground
	{"providers", "registry", "subscriptions", "ledger", // domain
		"oauth", "catalog"},
	{"formats", "chat", "messages", "responses", "passthrough", "relay"}, // wire
	{"dispatch", "answers", "maintain"},                                  // flow
	{"main", "cli", "server"},                                            // faces
}

// layerOf is a file's layer (its index in layers), -1 for none.
func layerOf(file string) int {
	for i, l := range layers {
		if slices.Contains(l, file) {
			return i
		}
	}
	return -1
}

func main() {
	dir := flag.String("dir", ".", "the package directory")
	maxTotal := flag.Int("max-total", 8000, "most non-test Go lines in the package")
	maxFile := flag.Int("max-file", 600, "most lines in one non-test Go file")
	maxUpward := flag.Int("max-upward", 0, "most uses of a name from a higher layer")
	readme := flag.String("readme", "README.md", "the README holding the rules table")
	flag.Parse()
	findings, err := check(*dir, *readme, *maxTotal, *maxFile, *maxUpward)
	if err != nil {
		fmt.Fprintln(os.Stderr, "structure:", err)
		os.Exit(2)
	}
	for _, f := range findings {
		fmt.Println(f)
	}
	if len(findings) > 0 {
		os.Exit(1)
	}
}

func check(dir, readme string, maxTotal, maxFile, maxUpward int) ([]string, error) {
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	var findings []string
	total := 0
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
		lines := fset.File(f.Pos()).LineCount()
		total += lines
		if lines > maxFile {
			findings = append(findings, fmt.Sprintf("%s: %d lines (more than %d)", filepath.Base(name), lines, maxFile))
		}
	}
	if total > maxTotal {
		findings = append(findings, fmt.Sprintf("package: %d non-test lines (more than %d)", total, maxTotal))
	}

	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Defs: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	pkg, err := conf.Check("main", fset, files, info)
	if err != nil {
		return nil, err
	}

	// upward: each file's uses of names from files of a higher layer.
	var upward []string
	seen := map[string]bool{}
	for _, f := range files {
		if name := base(fset, f.Pos()); layerOf(name) < 0 && !seen[name] {
			seen[name] = true
			findings = append(findings, fmt.Sprintf("%s.go has no layer (add it to .ci/structure's layers)", name))
		}
	}
	for id, obj := range info.Uses {
		if obj.Pkg() != pkg || !obj.Pos().IsValid() {
			continue
		}
		if obj.Parent() != nil && obj.Parent() != pkg.Scope() {
			continue // a local variable, parameter or label
		}
		from, to := base(fset, id.Pos()), base(fset, obj.Pos())
		if key := from + " " + to + " " + obj.Name(); layerOf(from) >= 0 && layerOf(from) < layerOf(to) && !seen[key] {
			seen[key] = true
			upward = append(upward, fmt.Sprintf("%s.go uses %s of %s.go, a higher layer", from, obj.Name(), to))
		}
	}
	if len(upward) > maxUpward {
		sort.Strings(upward)
		findings = append(findings, fmt.Sprintf("%d uses of a higher layer's names (more than %d):", len(upward), maxUpward))
		findings = append(findings, upward...)
	}

	aborts := 0
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 1 {
				return true
			}
			if fn, ok := call.Fun.(*ast.Ident); !ok || fn.Name != "panic" {
				return true
			}
			if sel, ok := call.Args[0].(*ast.SelectorExpr); ok && sel.Sel.Name == "ErrAbortHandler" {
				aborts++
			}
			return true
		})
	}
	if aborts != 1 {
		findings = append(findings, fmt.Sprintf("panic(http.ErrAbortHandler) written %d times (want 1)", aborts))
	}

	// SPEC §7.4: Brama adds no elapsed-time cutoff anywhere. Refused: a
	// context deadline, time.After/Tick/NewTicker, setting a time.Duration
	// field named …Timeout (an http.Client's, a Transport's, a Dialer's, a
	// Server's ReadTimeout) to anything but 0, and a Set…Deadline call but
	// one at time.Now() (an abort now). Idle bounds are not cutoffs: the
	// listener's ReadHeaderTimeout and IdleTimeout, a pool's IdleConnTimeout.
	clocks := map[string][]string{
		"context": {"WithTimeout", "WithTimeoutCause", "WithDeadline", "WithDeadlineCause"},
		"time":    {"After", "Tick", "NewTicker"},
	}
	cutoff := func(pos token.Pos, what string) {
		findings = append(findings, fmt.Sprintf("%s: %s is an elapsed-time cutoff (SPEC §7.4)", fset.Position(pos), what))
	}
	setsTimeout := func(field *ast.Ident, value ast.Expr) {
		v, ok := info.Uses[field].(*types.Var)
		if lit, zero := value.(*ast.BasicLit); zero && lit.Value == "0" || !ok || !v.IsField() ||
			!strings.HasSuffix(v.Name(), "Timeout") || types.TypeString(v.Type(), nil) != "time.Duration" {
			return
		}
		if !slices.Contains([]string{"ReadHeaderTimeout", "IdleTimeout", "IdleConnTimeout"}, v.Name()) {
			cutoff(field.Pos(), "the "+v.Name()+" field")
		}
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok {
					if pn, ok := info.Uses[x].(*types.PkgName); ok && slices.Contains(clocks[pn.Imported().Path()], n.Sel.Name) {
						cutoff(n.Pos(), x.Name+"."+n.Sel.Name)
					}
				}
			case *ast.AssignStmt:
				for i, lhs := range n.Lhs {
					if sel, ok := lhs.(*ast.SelectorExpr); ok && len(n.Rhs) == len(n.Lhs) {
						setsTimeout(sel.Sel, n.Rhs[i])
					}
				}
			case *ast.KeyValueExpr:
				if k, ok := n.Key.(*ast.Ident); ok {
					setsTimeout(k, n.Value)
				}
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok || !strings.HasPrefix(sel.Sel.Name, "Set") || !strings.HasSuffix(sel.Sel.Name, "Deadline") {
					return true
				}
				if len(n.Args) == 1 {
					if now, ok := n.Args[0].(*ast.CallExpr); ok && types.ExprString(now.Fun) == "time.Now" {
						return true
					}
				}
				cutoff(n.Pos(), sel.Sel.Name)
			}
			return true
		})
	}

	missing, err := readmeFunctions(filepath.Join(dir, readme), pkg)
	if err != nil {
		return nil, err
	}
	findings = append(findings, missing...)
	return findings, nil
}

func base(fset *token.FileSet, pos token.Pos) string {
	return strings.TrimSuffix(filepath.Base(fset.Position(pos).Filename), ".go")
}

// funcRef is a function a README row names: `name`, `Type.method` or
// `(*Type).method`, in the table's last column.
var funcRef = regexp.MustCompile("`(?:\\(\\*?)?([A-Za-z_][A-Za-z0-9_]*)(?:\\))?(?:\\.([A-Za-z_][A-Za-z0-9_]*))?`")

// readmeFunctions checks the rules table under README's "Reading the code"
// heading (the table whose last column is "where"): it must exist, each row
// must name a function, and each function it names must exist in pkg.
func readmeFunctions(path string, pkg *types.Package) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var findings []string
	in, rules, header, rows := false, false, true, 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			in = strings.Contains(strings.ToLower(line), "reading the code")
			continue
		}
		if !in || !strings.HasPrefix(line, "|") {
			header = true // the next table starts with its header
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), "|")
		last := strings.TrimSpace(cells[len(cells)-1])
		if header { // the rules table is the one whose last column is "where"
			header, rules = false, strings.EqualFold(last, "where")
			continue
		}
		if !rules || strings.Trim(line, "|-: ") == "" || strings.HasPrefix(last, "**") {
			continue // a separator, or a bold row naming a group of rules
		}
		refs := funcRef.FindAllStringSubmatch(last, -1)
		if len(refs) == 0 {
			findings = append(findings, fmt.Sprintf("README's rules table names no function for %q", strings.TrimSpace(cells[0])))
			continue
		}
		rows++
		for _, m := range refs {
			if !exists(pkg, m[1], m[2]) {
				name := m[1]
				if m[2] != "" {
					name += "." + m[2]
				}
				findings = append(findings, fmt.Sprintf("README names %s, which the package does not declare", name))
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if rows == 0 {
		findings = append(findings, "README has no \"Reading the code\" table of rules and functions")
	}
	sort.Strings(findings)
	return slices.Compact(findings), nil
}

// exists reports whether pkg declares name (a function, or a table such as
// budgets), or the method method of the type name.
func exists(pkg *types.Package, name, method string) bool {
	obj := pkg.Scope().Lookup(name)
	if obj == nil {
		return false
	}
	if method == "" {
		return true // a function, or the table (a var) that holds the rule
	}
	tn, ok := obj.(*types.TypeName)
	if !ok {
		return false
	}
	m, _, _ := types.LookupFieldOrMethod(types.NewPointer(tn.Type()), true, pkg, method)
	_, ok = m.(*types.Func)
	return ok
}
