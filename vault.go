package main

import (
	"errors"
	"fmt"
	"sync"
)

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

// vault reads and writes vault.json. It re-reads the file whenever its
// identity changes, so a CLI's change applies to a running daemon.
type vault struct {
	path    string
	pathErr error // set when there is no vault (SPEC §2.1)

	mu  sync.Mutex // guards doc, id, err
	doc *vaultDoc
	id  fileIdentity
	err error
}

// newVault opens the vault at path; pathErr says why there is none.
func newVault(path string, pathErr error) *vault {
	return &vault{path: path, pathErr: pathErr}
}

// load returns the current vault, re-reading only when the file changed.
// An absent file is an empty vault.
func (v *vault) load() (*vaultDoc, error) {
	if v.pathErr != nil {
		return nil, v.pathErr
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	id, err := guardFile("vault", v.path)
	if errors.Is(err, errFileAbsent) {
		v.doc, v.id, v.err = emptyVault(), fileIdentity{}, nil
		return v.doc, nil
	}
	if err != nil {
		v.doc, v.err = nil, err
		return nil, err
	}
	if v.doc != nil && id == v.id {
		return v.doc, v.err
	}
	doc, _, err := readVault(v.path)
	v.doc, v.id, v.err = doc, id, err
	return doc, err
}

// readVault reads and strictly parses the vault file.
func readVault(path string) (*vaultDoc, fileIdentity, error) {
	b, id, err := readGuarded("vault", path)
	if errors.Is(err, errFileAbsent) {
		return emptyVault(), id, nil
	}
	if err != nil {
		return nil, id, err
	}
	doc, err := parseVault(b)
	return doc, id, err
}

// parseVault strictly parses vault bytes; an empty file is an empty vault.
func parseVault(b []byte) (*vaultDoc, error) {
	doc := emptyVault()
	if len(b) == 0 {
		return doc, nil
	}
	if err := decodeStrict("vault", b, doc); err != nil {
		return nil, err
	}
	if doc.SchemaVersion != 1 {
		return nil, fmt.Errorf("vault: schema_version %d is not 1", doc.SchemaVersion)
	}
	doc.fill()
	return doc, nil
}

func emptyVault() *vaultDoc {
	d := &vaultDoc{SchemaVersion: 1}
	d.fill()
	return d
}

// fill makes every section non-nil so writers can assign into it.
func (d *vaultDoc) fill() {
	if d.Direct == nil {
		d.Direct = map[string]vaultKey{}
	}
	if d.Agents == nil {
		d.Agents = map[string]vaultAgent{}
	}
	if d.Subscriptions == nil {
		d.Subscriptions = map[string]vaultCredential{}
	}
}

// update changes the vault under its file lock: re-read, apply fn, replace
// atomically (SPEC §2.3). fn's error leaves the file untouched.
func (v *vault) update(fn func(d *vaultDoc) error) error {
	if v.pathErr != nil {
		return v.pathErr
	}
	read := func() (*vaultDoc, error) {
		doc, _, err := readVault(v.path)
		return doc, err
	}
	return editLocked(v.path, read, fn)
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
