package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// sys is the logger and clock Brama's parts take; no constructor has a default.
type sys struct {
	log *slog.Logger
	now func() time.Time
}

// state is where Brama keeps its files (SPEC §2.1); with none, every reader and writer refuses with cause.
type state struct {
	dir   string
	cause error
}

// errNoState is in every refusal for want of a state directory (SPEC §2.1): "<consumer> has no state directory: <cause>".
var errNoState = errors.New("no state directory")

// resolveState picks BRAMA_STATE_DIR, else <home>/.brama, and nothing else.
func resolveState(getenv func(string) string) state {
	d, what, sub := strings.TrimSpace(getenv("BRAMA_STATE_DIR")), "BRAMA_STATE_DIR", ""
	if d == "" {
		d, what, sub = strings.TrimSpace(getenv("HOME")), "$HOME", ".brama"
	}
	if d == "" {
		return state{cause: errors.New("$HOME is not defined")} // os.UserHomeDir's words on Unix
	} else if !filepath.IsAbs(d) { // it would be the working directory's
		return state{cause: fmt.Errorf("%s %q is not an absolute path", what, d)}
	}
	return state{dir: filepath.Join(d, sub)} // Join cleans: "/var/lib/brama/" is the same directory
}

func (s state) path(what, file string) (string, error) {
	if s.dir == "" {
		return "", fmt.Errorf("%s has %w: %w", what, errNoState, s.cause)
	}
	return filepath.Join(s.dir, file), nil
}

func (s state) fileOrState(getenv func(string) string, env, what, file string) (string, error) {
	if p := strings.TrimSpace(getenv(env)); filepath.IsAbs(p) {
		return p, nil
	} else if p != "" { // the same refusal as a relative state directory's
		s = state{cause: fmt.Errorf("%s %q is not an absolute path", env, p)}
	}
	return s.path(what, file)
}

// envWhole reads name as a whole number of unit ≥ least in bits: unset is def, a bad value def and an error.
func envWhole(getenv func(string) string, name, unit string, least, def int64, bits int) (int64, error) {
	v := strings.TrimSpace(getenv(name))
	if v == "" {
		return def, nil
	} else if n, err := strconv.ParseInt(v, 10, bits); err == nil && n >= least {
		return n, nil
	}
	return def, fmt.Errorf("%s=%q is not a whole number of %s ≥ %d", name, v, unit, least)
}

// envSeconds reads name as whole seconds ≥ least: unset is def, and so is a bad value, which it logs as event.
func envSeconds(getenv func(string) string, name, event string, least, def int64, log *slog.Logger) time.Duration {
	n, err := envWhole(getenv, name, "seconds", least, def, 32)
	if err != nil {
		log.Warn(event, "cause", err.Error(), "using_secs", n)
	}
	return time.Duration(n) * time.Second
}

var errFileAbsent = errors.New("file does not exist")

// fileIdentity tells a changed file from an unchanged one (SPEC §2.3, §4.2).
type fileIdentity struct {
	dev, ino uint64
	size     int64
	mtime    time.Time
}

// guardFile is SPEC §2.2's reader guards on name's Lstat or, with open, on the file it opens: a name swapped after a
// check cannot slip through, and a planted FIFO cannot hang the open. The file is nil unless the guards pass.
func guardFile(role, name string, open bool) (f *os.File, id fileIdentity, err error) {
	var fi os.FileInfo
	if !open {
		fi, err = os.Lstat(name)
	} else if f, err = os.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0); err == nil {
		fi, err = f.Stat()
	}
	switch {
	case errors.Is(err, os.ErrNotExist): // size -1: absence is an identity a stateFile keeps; no formatting: a hot path
		return nil, fileIdentity{size: -1}, &os.PathError{Op: role, Path: name, Err: errFileAbsent}
	case errors.Is(err, syscall.ELOOP) || err == nil && fi.Mode()&os.ModeSymlink != 0:
		err = fmt.Errorf("%s %s is a symlink; refusing to follow it", role, name)
	case err != nil:
		err = fmt.Errorf("%s: %w", role, err)
	case !fi.Mode().IsRegular():
		err = fmt.Errorf("%s %s is not a regular file", role, name)
	case int(fi.Sys().(*syscall.Stat_t).Uid) != os.Geteuid(): // Sys is a Stat_t on Unix (Brama needs flock)
		err = fmt.Errorf("%s %s is owned by uid %d, not this process's uid %d", role, name,
			fi.Sys().(*syscall.Stat_t).Uid, os.Geteuid())
	case fi.Mode().Perm()&0o077 != 0:
		err = fmt.Errorf("%s %s has mode %#o; it must not be readable or writable by group or other (chmod 600)", role, name,
			fi.Mode().Perm())
	default:
		st := fi.Sys().(*syscall.Stat_t)
		return f, fileIdentity{dev: uint64(st.Dev), ino: st.Ino, size: fi.Size(), mtime: fi.ModTime()}, nil
	}
	f.Close() // a nil *os.File answers ErrInvalid
	return nil, fileIdentity{}, err
}

func readGuarded(role, name string) ([]byte, fileIdentity, error) {
	f, id, err := guardFile(role, name, true)
	if err != nil {
		return nil, id, err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fileIdentity{}, fmt.Errorf("%s: %w", role, err)
	}
	return b, id, nil
}

// stateFile is one strict state file, re-read only when its identity changes (SPEC §2.3); absent: parse(nil) or errFileAbsent.
type stateFile[T any] struct {
	role, path string
	pathErr    error                   // why there is no file (no state directory), else nil
	parse      func([]byte) (T, error) // an absent file is parse(nil); nil: decodeStrict, and absence is errFileAbsent
	absentErr  bool                    // absence is errFileAbsent even with parse set
	memory     *T                      // with pathErr set, what load answers instead of refusing (nil: refuse)

	mu  sync.Mutex
	doc T
	err error        // the parse failure kept with doc: an unchanged bad file is not parsed again
	id  fileIdentity // of the file doc and err came from; zero: nothing kept (a file that could not be read)
}

func (f *stateFile[T]) load() (T, error) {
	if f.pathErr != nil && f.memory != nil { // memory is set before serving starts: no lock
		return *f.memory, nil
	}
	_, id, _ := guardFile(f.role, f.path, false) // outside the lock: concurrent requests do not queue behind one lstat
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.id == (fileIdentity{}) || id != f.id {
		f.doc, f.id, f.err = f.read()
	}
	return f.doc, f.err
}

// read reads and parses the file past the cache; the identity is zero when the file could not be read (absent is not).
func (f *stateFile[T]) read() (doc T, id fileIdentity, err error) {
	if f.pathErr != nil {
		return doc, id, f.pathErr
	}
	b, id, err := readGuarded(f.role, f.path)
	if f.parse == nil && err == nil {
		err = decodeStrict(f.role, b, &doc)
	} else if f.parse != nil && (err == nil || errors.Is(err, errFileAbsent) && !f.absentErr) { // absent: parse(nil)
		doc, err = f.parse(b)
	}
	return doc, id, err
}

// update is the flocked read-modify-rename (SPEC §2.3); the result must validate.
func (f *stateFile[T]) update(change func(T) error) error {
	if f.pathErr != nil {
		return f.pathErr
	}
	return withFileLock(f.path, func() error {
		f.mu.Lock() // a parse may keep state (the vault's unwritten grants)
		doc, _, err := f.read()
		f.mu.Unlock()
		if err == nil {
			err = change(doc)
		}
		if v, ok := any(doc).(validator); ok && err == nil {
			err = v.validate()
		}
		if err == nil {
			err = writeState(f.path, doc)
		}
		return err
	})
}

// testingOnlyRename replaces os.Rename in writeFileAtomic (nil in production).
var testingOnlyRename func(oldpath, newpath string) error

// writeFileAtomic is every whole-file writer's owner-only atomic replacement (SPEC §2.2).
func writeFileAtomic(name string, data []byte) error {
	return placeFile(name, data, pick(testingOnlyRename != nil, testingOnlyRename, os.Rename))
}

// publishFile creates name only if it does not exist (os.ErrExist): a reservation (SPEC §12).
func publishFile(name string, data []byte) error { return placeFile(name, data, os.Link) }

// placeFile puts data at name by place (link or rename) of a synced 0600 sibling temporary, then syncs the directory.
func placeFile(name string, data []byte, place func(oldpath, newpath string) error) error {
	dir := filepath.Dir(name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(name)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after a rename the name is gone; after a link it is the spare
	if _, err = f.Write(data); err == nil {
		err = f.Sync() // the bytes reach the disk before the name points at them
	}
	if err = errors.Join(err, f.Close()); err == nil {
		err = place(f.Name(), name)
	}
	if err != nil {
		return err
	}
	return syncDir(dir) // makes the rename or link itself durable
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// marshalState is the one encoding of state files: indented, a final newline, to diff well.
func marshalState(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	return append(b, '\n'), err
}

func writeState(name string, v any) error {
	b, err := marshalState(v)
	if err != nil {
		return err
	}
	return writeFileAtomic(name, b)
}

// withFileLock runs fn holding the flock on name+".lock" (SPEC §2.3).
func withFileLock(name string, fn func() error) error {
	lf, err := flockFile(name+".lock", os.O_CREATE, syscall.LOCK_EX)
	if err != nil {
		return fmt.Errorf("lock %s: %w", filepath.Base(name)+".lock", err)
	}
	defer lf.Close() // closing the file releases the lock
	return fn()
}

// flockFile opens name with flag (0600, never through a planted symlink; O_CREATE makes its directory too) and flocks
// it how (LOCK_EX or LOCK_SH, perhaps |LOCK_NB). Without O_CREATE it is a probe: it creates nothing.
func flockFile(name string, flag, how int) (*os.File, error) {
	if flag&os.O_CREATE != 0 {
		if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
			return nil, err
		}
	}
	f, err := os.OpenFile(name, syscall.O_NOFOLLOW|flag, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// lockServe takes the one-serve-per-state-directory lock (SPEC §2.3).
func lockServe(s state) (*os.File, error) {
	if s.dir == "" {
		return nil, nil
	}
	name := filepath.Join(s.dir, "serve.lock")
	f, err := flockFile(name, os.O_CREATE, syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return nil, fmt.Errorf("another brama serve holds %s", name)
	}
	return f, err
}

// staleTempName matches placeFile's temporary names: "." + base + ".tmp" + digits.
var staleTempName = regexp.MustCompile(`^\.(.+)\.tmp[0-9]+$`)

// removeStaleTemps removes and counts a crash's temporary files (one may copy old secrets) in dir, answers/*/, and
// beside each file of elsewhere outside dir, that file's only. The caller holds serve.lock; beside a <file>.lock, that too.
func removeStaleTemps(dir string, elsewhere ...string) (n int, err error) {
	sweeps := [][2]string{{dir, ""}} // a directory, and the one file whose temps go there ("": every file's)
	answers, _ := os.ReadDir(filepath.Join(dir, "answers"))
	for _, e := range answers {
		if e.IsDir() {
			sweeps = append(sweeps, [2]string{filepath.Join(dir, "answers", e.Name()), ""})
		}
	}
	for _, f := range elsewhere {
		if f != "" && filepath.Dir(f) != filepath.Clean(dir) {
			sweeps = append(sweeps, [2]string{filepath.Dir(f), filepath.Base(f)})
		}
	}
	for _, sw := range sweeps {
		entries, err := os.ReadDir(sw[0])
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return n, err
		}
		for _, e := range entries {
			m := staleTempName.FindStringSubmatch(e.Name())
			if !e.Type().IsRegular() || m == nil || sw[1] != "" && m[1] != sw[1] {
				continue
			}
			lf, err := flockFile(filepath.Join(sw[0], m[1]+".lock"), 0, syscall.LOCK_EX) // a probe: it creates no lock
			if err == nil || errors.Is(err, os.ErrNotExist) {
				err = os.Remove(filepath.Join(sw[0], e.Name()))
			}
			lf.Close() // nil without a lock file
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// vaultDoc is vault.json (SPEC §2.2), the only file that holds secrets.
type vaultDoc struct {
	SchemaVersion int                        `json:"schema_version"`
	Direct        map[string]vaultCredential `json:"direct"`
	Subscriptions map[string]vaultCredential `json:"subscriptions"`
}

// vaultCredential is a direct key (APIKey only) or one subscription's API key or OAuth grant, never both.
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

// vault is vault.json, re-read on change so a CLI's edit reaches the daemon. A rotated grant the vault refused is kept
// (SPEC §17): each parse puts it in while the vault holds the token it replaced (every write takes it), then forgets it.
type vault struct {
	stateFile[*vaultDoc]
	unwritten map[string][2]oauthGrant // under mu, by subscription id: the stored grant replaced, and its rotation
}

// newVault's parse is strict, every section non-nil (maps.Collect never answers nil); an empty file is an empty vault.
func newVault(path string, pathErr error) *vault {
	v := &vault{stateFile: stateFile[*vaultDoc]{role: "vault", path: path, pathErr: pathErr}, unwritten: map[string][2]oauthGrant{}}
	v.parse = func(b []byte) (doc *vaultDoc, err error) { // stateFile runs it under mu
		doc = &vaultDoc{SchemaVersion: 1}
		if len(b) > 0 {
			err = decodeStrict("vault", b, doc)
		}
		doc.Direct, doc.Subscriptions = maps.Collect(maps.All(doc.Direct)), maps.Collect(maps.All(doc.Subscriptions))
		for id, u := range v.unwritten {
			if c := doc.Subscriptions[id].OAuth; err == nil && c != nil && c.RefreshToken == u[0].RefreshToken {
				doc.Subscriptions[id] = vaultCredential{OAuth: &u[1]}
			} else if err == nil {
				delete(v.unwritten, id) // the file holds it now, or a sign-in replaced both
			}
		}
		return doc, err
	}
	return v
}

// keepUnwritten keeps g, the rotation of old, until a vault write takes it.
func (v *vault) keepUnwritten(id string, old, g oauthGrant) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if u := v.unwritten[id]; u[1].RefreshToken == old.RefreshToken {
		old = u[0] // old was itself unwritten
	}
	v.unwritten[id] = [2]oauthGrant{old, g}
	v.id = fileIdentity{} // the next load parses again, putting g in
}

// unwrittenIDs loads the vault first: the parse forgets the grants the file holds now.
func (v *vault) unwrittenIDs() []string {
	v.load()
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Sorted(maps.Keys(v.unwritten))
}

// writeUnwritten writes the unwritten grants again (each pass, SPEC §17).
func (v *vault) writeUnwritten(log *slog.Logger) {
	if ids := v.unwrittenIDs(); len(ids) > 0 {
		if err := v.update(func(*vaultDoc) error { return nil }); err != nil {
			log.Error("credential_refresh_unwritten", "subscriptions", ids, "error", redact(err.Error()))
		}
	}
}

func jsonText(s string) json.RawMessage { return must(json.Marshal(s)) }

func valueOr[T any](p *T, or T) T {
	if p == nil {
		return or
	}
	return *p
}

// pick is yes when cond holds, else no: Go's missing conditional expression (both are evaluated).
func pick[T any](cond bool, yes, no T) T {
	if cond {
		return yes
	}
	return no
}

// must is v for marshalling that cannot fail (plain values).
func must(v []byte, err error) json.RawMessage {
	if err != nil {
		panic(err)
	}
	return v
}
