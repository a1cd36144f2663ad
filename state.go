package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"
)

// sys is what Brama's parts take from the process: the logger and the
// clock. serve and each command build one; no constructor has a default.
type sys struct {
	log *slog.Logger
	now func() time.Time
}

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
		return state{cause: errors.New("$HOME is not defined")} // os.UserHomeDir's words on Unix
	}
	return state{dir: filepath.Join(home, ".brama")}
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

// errFileAbsent marks a state file that does not exist yet.
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

// readGuarded reads name under the guards (an absent file is errFileAbsent).
func readGuarded(role, name string) ([]byte, fileIdentity, error) {
	f, id, err := openGuarded(role, name)
	if err != nil {
		return nil, id, err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, id, fmt.Errorf("%s: %w", role, err)
	}
	return b, id, nil
}

// openGuarded opens name without following a symlink and applies the guards
// to the open file, so a name swapped between check and read cannot slip
// through; the caller closes the file.
func openGuarded(role, name string) (*os.File, fileIdentity, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0) // O_NONBLOCK: a FIFO planted here must not hang the reader
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fileIdentity{}, fmt.Errorf("%s %s: %w", role, name, errFileAbsent)
	case errors.Is(err, syscall.ELOOP):
		return nil, fileIdentity{}, fmt.Errorf("%s %s is a symlink; refusing to follow it", role, name)
	case err != nil:
		return nil, fileIdentity{}, fmt.Errorf("%s: %w", role, err)
	}
	fi, err := f.Stat()
	var id fileIdentity
	if err == nil {
		id, err = checkFileInfo(role, name, fi)
	} else {
		err = fmt.Errorf("%s: %w", role, err)
	}
	if err != nil {
		f.Close()
		return nil, id, err
	}
	return f, id, nil
}

// stateFile is one strict state file, read again only when its identity
// changes (SPEC §2.3), so another process's replacement applies at the next
// load. An absent file is parse(nil), or errFileAbsent when absentErr.
type stateFile[T any] struct {
	role, path string
	pathErr    error // why there is no file (no state directory), else nil
	parse      func([]byte) (T, error)
	absentErr  bool

	mu   sync.Mutex // guards read, doc, id
	read bool       // doc and id hold the last good read
	doc  T
	id   fileIdentity
}

// load returns the current document, reading the file only when it changed.
func (f *stateFile[T]) load() (T, error) {
	if f.pathErr != nil {
		var zero T
		return zero, f.pathErr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if id, err := guardFile(f.role, f.path); err == nil && f.read && id == f.id {
		return f.doc, nil
	}
	doc, id, err := f.readNow()
	f.read, f.doc, f.id = err == nil && id != fileIdentity{}, doc, id // an absent file is not kept
	return doc, err
}

// fresh reads the file now, past the cache: the read of a read-modify-rename.
func (f *stateFile[T]) fresh() (T, error) {
	doc, _, err := f.readNow()
	return doc, err
}

// readNow reads and parses the file under the guards.
func (f *stateFile[T]) readNow() (T, fileIdentity, error) {
	b, id, err := readGuarded(f.role, f.path)
	if errors.Is(err, errFileAbsent) && !f.absentErr {
		b, err = nil, nil
	}
	if err != nil {
		var zero T
		return zero, id, err
	}
	doc, err := f.parse(b)
	return doc, id, err
}

// forget drops the cached document, so the next load reads the file.
func (f *stateFile[T]) forget() {
	f.mu.Lock()
	f.read = false
	f.mu.Unlock()
}

// testingOnlyRename replaces os.Rename in writeFileAtomic (nil in production).
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
// (os.Link fails with fs.ErrExist): a signed answer's reservation (SPEC §12).
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
	lf, err := flockFile(name+".lock", 0)
	if err != nil {
		return fmt.Errorf("lock %s: %w", filepath.Base(name)+".lock", err)
	}
	defer lf.Close() // closing the file releases the lock
	return fn()
}

// flockFile opens the lock file name (creating it and its directory, 0600
// and 0700) and takes an exclusive flock on it; nb is 0 or LOCK_NB.
func flockFile(name string, nb int) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|nb); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// snapshotFile writes numbered snapshots of one file in order, dropping one
// older than what is on disk, so racing flushes never put old bytes over
// new (the ledger, perf telemetry).
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

// lockServe takes the one-serve-per-state-directory lock (SPEC §2.3),
// held until the returned file is closed.
func lockServe(s state) (*os.File, error) {
	if s.dir == "" {
		return nil, nil
	}
	name := filepath.Join(s.dir, "serve.lock")
	f, err := flockFile(name, syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return nil, fmt.Errorf("another brama serve holds %s", name)
	}
	return f, err
}

// staleTempName matches the temporary names placeFile creates:
// os.CreateTemp's "." + base + ".tmp" + random digits.
var staleTempName = regexp.MustCompile(`^\..+\.tmp[0-9]+$`)

// removeStaleTemps removes (and counts) the temporary files of placeFile a
// crash left in dir and its answers/<client>/ directories: one may be a
// whole copy of the vault, whose old secrets would outlive their rotation.
// The caller holds serve.lock; a temporary file beside a <file>.lock is
// removed under that lock, so a CLI's write in progress is never cut short.
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

// decodeStrict is the one strict decoder, for every state file and admin
// body (SPEC §2.2): invalid UTF-8, duplicate object keys at any depth,
// unknown members and trailing data are refused, naming role and member.
// When v is a validator its rules are applied after decoding; their error
// is returned as is.
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
	if d, ok := v.(validator); ok {
		return d.validate()
	}
	return nil
}

// validator is a document with rules beyond its shape (schema version, id
// patterns, uniqueness); validate may also fill in empty sections.
type validator interface{ validate() error }

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

// vaultDoc is vault.json (SPEC §2.2), the only file that holds secrets.
type vaultDoc struct {
	SchemaVersion int                        `json:"schema_version"`
	Direct        map[string]vaultKey        `json:"direct"`
	Agents        map[string]vaultAgent      `json:"agents"`
	Subscriptions map[string]vaultCredential `json:"subscriptions"`
}

// vaultKey is a direct API key for one provider.
type vaultKey struct {
	APIKey string `json:"api_key"`
}

// vaultAgent holds one agent's HMAC signing secret (64 hex characters; the
// key is the string's bytes, SPEC §3.2).
type vaultAgent struct {
	SigningSecret string `json:"signing_secret"`
}

// vaultCredential is one subscription's credential: an API key or an OAuth
// grant, never both.
type vaultCredential struct {
	APIKey string      `json:"api_key,omitempty"`
	OAuth  *oauthGrant `json:"oauth,omitempty"`
}

// oauthGrant is a stored OAuth grant (SPEC §11.1).
type oauthGrant struct {
	AccessToken  string `json:"access_token"`
	RefreshToken string `json:"refresh_token"`
	ExpiresAtMs  int64  `json:"expires_at_ms"`
	IDToken      string `json:"id_token,omitempty"`
	AccountID    string `json:"account_id,omitempty"`
}

// vault reads (re-reading on change, so a CLI's change applies to a
// running daemon) and writes vault.json.
type vault struct{ stateFile[*vaultDoc] }

// newVault opens the vault at path; pathErr says why there is none (SPEC §2.1).
func newVault(path string, pathErr error) *vault {
	return &vault{stateFile[*vaultDoc]{role: "vault", path: path, pathErr: pathErr, parse: parseVault}}
}

// parseVault strictly parses vault bytes; an empty file is an empty vault.
func parseVault(b []byte) (*vaultDoc, error) {
	doc := &vaultDoc{SchemaVersion: 1}
	if len(b) == 0 {
		return doc, doc.validate()
	}
	if err := decodeStrict("vault", b, doc); err != nil {
		return nil, err
	}
	return doc, nil
}

// validate refuses another schema and makes every section non-nil, so
// writers can assign into it.
func (d *vaultDoc) validate() error {
	if d.SchemaVersion != 1 {
		return fmt.Errorf("vault: schema_version %d is not 1", d.SchemaVersion)
	}
	if d.Direct == nil {
		d.Direct = map[string]vaultKey{}
	}
	if d.Agents == nil {
		d.Agents = map[string]vaultAgent{}
	}
	if d.Subscriptions == nil {
		d.Subscriptions = map[string]vaultCredential{}
	}
	return nil
}

// update changes the vault under its file lock: re-read, apply fn, replace
// atomically (SPEC §2.3). fn's error leaves the file untouched.
func (v *vault) update(fn func(d *vaultDoc) error) error {
	if v.pathErr != nil {
		return v.pathErr
	}
	return editLocked(v.path, v.fresh, fn)
}

// directKey returns the vault's API key for provider, or "".
func (v *vault) directKey(provider string) string {
	doc, err := v.load()
	if err != nil {
		return ""
	}
	return doc.Direct[provider].APIKey
}

// agentSecret returns agent's signing secret, or false.
func (v *vault) agentSecret(agent string) (string, bool) {
	doc, err := v.load()
	if err != nil {
		return "", false
	}
	a, ok := doc.Agents[agent]
	return a.SigningSecret, ok && a.SigningSecret != ""
}
