package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"
)

// state is where Brama keeps its files (SPEC §2.1). When no directory
// resolves, dir is empty and cause says why; every reader and writer then
// refuses with a *noStateError instead of the process stopping.
type state struct {
	dir   string
	cause error
}

// noStateError is the refusal of every state reader and writer when no state
// directory resolved. Its text names the cause from resolving home.
type noStateError struct {
	what  string // the consumer, e.g. "journal"
	cause error
}

func (e *noStateError) Error() string {
	return fmt.Sprintf("%s has no state directory: %v", e.what, e.cause)
}
func (e *noStateError) Unwrap() error { return e.cause }

// resolveState picks BRAMA_STATE_DIR (trimmed), else <home>/.brama. It never
// falls back to the working directory or a temporary directory.
func resolveState(getenv func(string) string) state {
	if d := strings.TrimSpace(getenv("BRAMA_STATE_DIR")); d != "" {
		return state{dir: d}
	}
	home := strings.TrimSpace(getenv("HOME"))
	if home == "" {
		// os.UserHomeDir reads $HOME on Unix; asking it gives the standard cause text.
		_, err := homeDirFrom(getenv)
		return state{cause: err}
	}
	return state{dir: filepath.Join(home, ".brama")}
}

// homeDirFrom mirrors os.UserHomeDir on Unix over an injected environment.
func homeDirFrom(getenv func(string) string) (string, error) {
	if h := getenv("HOME"); h != "" {
		return h, nil
	}
	return "", errors.New("$HOME is not defined")
}

// path names file inside the state directory for consumer what, or refuses.
func (s state) path(what, file string) (string, error) {
	if s.dir == "" {
		return "", &noStateError{what: what, cause: s.cause}
	}
	return filepath.Join(s.dir, file), nil
}

// fileOrState is the override named by env when set, else file in the
// state directory.
func (s state) fileOrState(getenv func(string) string, env, what, file string) (string, error) {
	if p := strings.TrimSpace(getenv(env)); p != "" {
		return p, nil
	}
	return s.path(what, file)
}

// errFileAbsent marks a state file that does not exist yet (callers treat it
// as empty).
var errFileAbsent = errors.New("file does not exist")

// fileIdentity is what tells a changed file from an unchanged one without
// reading it (SPEC §4.2, §2.3).
type fileIdentity struct {
	dev, ino uint64
	size     int64
	mtime    time.Time
}

// guardFile applies the reader guards of SPEC §2.2 to name and returns its
// identity: refuse a symlink, a non-regular file, a file owned by another
// uid, or one readable or writable by group or other, naming the rule.
func guardFile(role, name string) (fileIdentity, error) {
	fi, err := os.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return fileIdentity{}, fmt.Errorf("%s %s: %w", role, name, errFileAbsent)
	}
	if err != nil {
		return fileIdentity{}, fmt.Errorf("%s: %w", role, err)
	}
	return checkFileInfo(role, name, fi)
}

// checkFileInfo is the guards themselves, on what Lstat or Fstat saw.
func checkFileInfo(role, name string, fi fs.FileInfo) (fileIdentity, error) {
	if fi.Mode()&fs.ModeSymlink != 0 {
		return fileIdentity{}, fmt.Errorf("%s %s is a symlink; refusing to follow it", role, name)
	}
	if !fi.Mode().IsRegular() {
		return fileIdentity{}, fmt.Errorf("%s %s is not a regular file", role, name)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileIdentity{}, fmt.Errorf("%s %s: no owner information", role, name)
	}
	if int(st.Uid) != os.Geteuid() {
		return fileIdentity{}, fmt.Errorf("%s %s is owned by uid %d, not this process's uid %d", role, name, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fileIdentity{}, fmt.Errorf("%s %s has mode %#o; it must not be readable or writable by group or other (chmod 600)", role, name, fi.Mode().Perm())
	}
	return fileIdentity{dev: uint64(st.Dev), ino: st.Ino, size: fi.Size(), mtime: fi.ModTime()}, nil
}

// readGuarded reads name under the guards. The file is opened without
// following a symlink and the guards are applied to the open file, so a
// name swapped between the check and the read cannot slip through. An
// absent file is errFileAbsent.
func readGuarded(role, name string) ([]byte, fileIdentity, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0) // O_NONBLOCK: a FIFO planted here must not hang the reader
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fileIdentity{}, fmt.Errorf("%s %s: %w", role, name, errFileAbsent)
	case errors.Is(err, syscall.ELOOP):
		return nil, fileIdentity{}, fmt.Errorf("%s %s is a symlink; refusing to follow it", role, name)
	case err != nil:
		return nil, fileIdentity{}, fmt.Errorf("%s: %w", role, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fileIdentity{}, fmt.Errorf("%s: %w", role, err)
	}
	id, err := checkFileInfo(role, name, fi)
	if err != nil {
		return nil, id, err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, id, fmt.Errorf("%s: %w", role, err)
	}
	return b, id, nil
}

// testingOnlyRename replaces os.Rename inside writeFileAtomic (nil in
// production) so tests can make the rename fail.
var testingOnlyRename func(oldpath, newpath string) error

// writeFileAtomic is the owner-only atomic replacement every whole-file
// writer uses (SPEC §2.2): readers see the old bytes or the new, never a mix,
// and the new bytes are durable when it returns nil.
func writeFileAtomic(name string, data []byte) error {
	rename := os.Rename
	if testingOnlyRename != nil {
		rename = testingOnlyRename
	}
	return placeFile(name, data, rename)
}

// publishFile creates name with data only if no file has that name yet
// (os.Link fails with fs.ErrExist when it is taken): the exclusive
// publication of a signed answer's reservation (SPEC §12).
func publishFile(name string, data []byte) error {
	return placeFile(name, data, os.Link)
}

// placeFile writes data whole to a sibling temporary file (O_EXCL, 0600),
// fsyncs it, puts it at name with place (rename or link), removes the
// temporary name, and fsyncs the directory so the new name survives a
// crash. On any failure the target is untouched.
func placeFile(name string, data []byte, place func(oldpath, newpath string) error) error {
	dir := filepath.Dir(name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// os.CreateTemp opens with O_RDWR|O_CREATE|O_EXCL and mode 0600.
	f, err := os.CreateTemp(dir, "."+filepath.Base(name)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after a rename the name is gone; after a link it is the spare
	if _, err = f.Write(data); err == nil {
		err = f.Sync() // the bytes reach the disk before the name points at them
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = place(f.Name(), name)
	}
	if err != nil {
		return err
	}
	return syncDir(dir) // makes the rename or link itself durable
}

// syncDir fsyncs a directory so a rename inside it survives a crash.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// withFileLock runs fn while holding an exclusive flock on name+".lock"
// (SPEC §2.3). The lock file is created 0600 once and holds nothing.
func withFileLock(name string, fn func() error) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return err
	}
	lf, err := os.OpenFile(name+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer lf.Close()
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", filepath.Base(name)+".lock", err)
	}
	defer syscall.Flock(int(lf.Fd()), syscall.LOCK_UN)
	return fn()
}

// snapshotFile writes numbered snapshots of one file in order: a snapshot
// older than the one already on disk is dropped, so two flushes racing each
// other never let old bytes replace new ones (the ledger, perf telemetry).
type snapshotFile struct {
	mu      sync.Mutex // guards written; serializes the file's writes
	written uint64     // seq of the newest snapshot on disk
}

// write replaces name with data when seq is newer than what is on disk.
func (f *snapshotFile) write(name string, seq uint64, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if seq <= f.written {
		return nil
	}
	if err := writeFileAtomic(name, data); err != nil {
		return err
	}
	f.written = seq
	return nil
}

// editLocked is the read-modify-rename of every file a CLI and the daemon
// may both edit (SPEC §2.3): under the file's flock it re-reads the current
// document, lets change edit it, and replaces the file atomically with its
// encoding. change's error leaves the file untouched.
func editLocked[T any](name string, read func() (T, error), change func(T) error) error {
	return withFileLock(name, func() error {
		doc, err := read()
		if err != nil {
			return err
		}
		if err := change(doc); err != nil {
			return err
		}
		b, err := marshalState(doc)
		if err != nil {
			return err
		}
		return writeFileAtomic(name, b)
	})
}

// lockServe takes the one-serve-per-state-directory lock (SPEC §2.3). The
// returned file keeps the lock until closed.
func lockServe(s state) (*os.File, error) {
	if s.dir == "" {
		return nil, nil
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, err
	}
	name := filepath.Join(s.dir, "serve.lock")
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another brama serve holds %s", name)
	}
	return f, nil
}

// staleTempName matches the temporary names placeFile creates:
// os.CreateTemp's "." + base + ".tmp" + random digits.
var staleTempName = regexp.MustCompile(`^\..+\.tmp[0-9]+$`)

// removeStaleTemps removes the temporary files of placeFile that a crash
// left in the state directory dir and its answers/<client>/ directories,
// and returns how many it removed. A crash between CreateTemp and rename
// leaves one, possibly a whole copy of the vault, so old secrets would
// otherwise outlive their rotation. The caller holds serve.lock, so no
// other serve writes here; a temporary file beside a <file>.lock that a CLI
// may hold is removed under that lock, so a CLI's write in progress is never
// cut short.
func removeStaleTemps(dir string) (int, error) {
	dirs := []string{dir}
	answers := filepath.Join(dir, "answers")
	if subs, err := os.ReadDir(answers); err == nil {
		for _, e := range subs {
			if e.IsDir() {
				dirs = append(dirs, filepath.Join(answers, e.Name()))
			}
		}
	}
	n := 0
	for _, d := range dirs {
		entries, err := os.ReadDir(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return n, err
		}
		for _, e := range entries {
			if !e.Type().IsRegular() || !staleTempName.MatchString(e.Name()) {
				continue
			}
			temp := filepath.Join(d, e.Name())
			target := filepath.Join(d, e.Name()[1:strings.LastIndex(e.Name(), ".tmp")])
			remove := func() error { return os.Remove(temp) }
			if _, err := os.Lstat(target + ".lock"); err == nil {
				err = withFileLock(target, remove)
			} else {
				err = remove()
			}
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// decodeStrict decodes one JSON document into v for the strict state files
// (SPEC §2.2): invalid UTF-8, duplicate object keys at any depth, unknown
// members and trailing data are refused, naming role and member.
func decodeStrict(role string, b []byte, v any) error {
	if !utf8.Valid(b) {
		return fmt.Errorf("%s is not valid UTF-8", role)
	}
	if err := checkDuplicateKeys(json.NewDecoder(bytes.NewReader(b))); err != nil {
		return fmt.Errorf("%s: %w", role, err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", role, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%s: data after the JSON document", role)
	}
	return nil
}

// maxJSONDepth is the deepest nesting of arrays and objects Brama reads in
// any JSON body or state file (SPEC §8.2: deeper is 400 invalid_request).
const maxJSONDepth = 1000

// errTooDeep refuses JSON nested deeper than maxJSONDepth.
var errTooDeep = fmt.Errorf("JSON nests deeper than %d levels", maxJSONDepth)

// checkNesting refuses b when its arrays and objects nest deeper than
// maxJSONDepth. It only counts brackets outside strings, without
// allocating, so a hostile body costs one pass over its bytes before any
// parser sees it (issue 10: a 3,000,000-deep body exhausted the stack).
// Whether b is JSON at all is left to the parser that follows.
func checkNesting(b []byte) error {
	depth, inString, escaped := 0, false, false
	for _, c := range b {
		switch {
		case escaped:
			escaped = false
		case inString:
			switch c {
			case '\\':
				escaped = true
			case '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			if depth++; depth > maxJSONDepth {
				return errTooDeep
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return nil
}

// checkDuplicateKeys walks one JSON value token by token and refuses an
// object that names a key twice (encoding/json would keep the last). It
// keeps its own stack, one frame per open array or object, and refuses
// nesting deeper than maxJSONDepth, so no input can exhaust the goroutine
// stack or grow the stack without bound.
func checkDuplicateKeys(dec *json.Decoder) error {
	type frame struct {
		seen    map[string]bool // an object's keys so far; nil for an array
		wantKey bool            // an object's next token is a key
	}
	var stack []frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1] // the decoder checked it closes the top
			if len(stack) == 0 {
				return nil
			}
			continue
		}
		if n := len(stack); n > 0 && stack[n-1].wantKey {
			key, _ := tok.(string)
			if stack[n-1].seen[key] {
				return fmt.Errorf("duplicate key %q", key)
			}
			stack[n-1].seen[key], stack[n-1].wantKey = true, false
			continue
		}
		if n := len(stack); n > 0 && stack[n-1].seen != nil {
			stack[n-1].wantKey = true // after this value, a key or '}'
		}
		d, ok := tok.(json.Delim)
		if !ok {
			if len(stack) == 0 {
				return nil // a scalar document
			}
			continue
		}
		if len(stack) == maxJSONDepth {
			return errTooDeep
		}
		f := frame{}
		if d == '{' {
			f = frame{seen: map[string]bool{}, wantKey: true}
		}
		stack = append(stack, f)
	}
}

// marshalState is the one encoding of Brama's JSON state files: two-space
// indentation and a final newline, so files diff and read well.
func marshalState(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
