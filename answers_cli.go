package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// answersCmd runs `brama answers verify|prune` (SPEC §12 items 6 and 7).
func (e cliEnv) answersCmd(args []string) error {
	return e.sub("answers", args, map[string]func([]string) error{"verify": e.answersVerify, "prune": e.answersPrune})
}

// answersVerify checks a signed answer against $STATE/answer-key: a kept
// answer file's signature over its decoded body, or, with -signature, the
// given signature over a file of raw body bytes. It prints ok, or fails
// with errSignatureMismatch (exit 1).
func (e cliEnv) answersVerify(args []string) error {
	fs := e.newFlags("answers verify")
	sigFlag := fs.String("signature", "", "check `v1=HEX` (a Brama-Answer-Signature) over FILE's raw bytes instead of reading FILE as a kept answer")
	const usage = "answers verify [-signature v1=HEX] FILE"
	pos, err := parseFlags(fs, args, 1, usage)
	if err != nil {
		return err
	}
	if *sigFlag != "" && !isAnswerSignature(strings.ToLower(*sigFlag)) {
		return &usageError{"-signature must be v1= followed by 64 hex digits"}
	}
	st := resolveState(e.getenv)
	name, err := st.path("answer key", "answer-key")
	if err != nil {
		return err
	}
	key, err := readAnswerKey(name)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(pos[0])
	if err != nil {
		return err
	}
	body, sig := data, strings.ToLower(*sigFlag)
	if sig == "" {
		rec, err := decodeAnswerRecord(data)
		if err != nil {
			return fmt.Errorf("%s: %w", pos[0], err)
		}
		if rec.State != answerComplete {
			return fmt.Errorf("%s: the answer is still in progress; there is no signature to check", pos[0])
		}
		body, sig = rec.body(), *rec.Signature
	}
	if !verifyAnswer(key, body, sig) {
		return errSignatureMismatch
	}
	fmt.Fprintln(e.stdout, "ok")
	return nil
}

// answersPrune removes complete kept answers whose completion is older
// than -older-than. It never removes an answer in progress, and only reads
// each record before removing it: a complete record never changes again,
// so the serving process may keep running.
func (e cliEnv) answersPrune(args []string) error {
	fs := e.newFlags("answers prune")
	olderThan := fs.Duration("older-than", -1, "remove complete answers kept longer ago than this `duration` (e.g. 720h)")
	if _, err := parseFlags(fs, args, 0, "answers prune -older-than DURATION"); err != nil {
		return err
	}
	if *olderThan < 0 {
		return &usageError{"usage: brama answers prune -older-than DURATION (a duration of zero or more)"}
	}
	dir, err := resolveState(e.getenv).path("signed answers", "answers")
	if err != nil {
		return err
	}
	cutoff := time.Now().Add(-*olderThan)
	removed, err := pruneAnswers(dir, cutoff, func(name string, err error) {
		fmt.Fprintf(e.stderr, "brama: skipped %s: %v\n", name, err)
	})
	fmt.Fprintf(e.stdout, "removed %d complete answers older than %s\n", removed, *olderThan)
	return err
}

// pruneAnswers removes every complete record under dir completed before
// cutoff and reports the unreadable ones to skip. A missing dir holds
// nothing to prune.
func pruneAnswers(dir string, cutoff time.Time, skip func(name string, err error)) (int, error) {
	removed := 0
	err := filepath.WalkDir(dir, func(name string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && name == dir {
			return filepath.SkipDir
		}
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(name, ".json") || strings.HasPrefix(d.Name(), ".") {
			return nil // temporary files are not records
		}
		b, _, err := readGuarded("kept answer", name)
		var rec *answerRecord
		if err == nil {
			rec, err = decodeAnswerRecord(b)
		}
		if err != nil {
			skip(name, err)
			return nil
		}
		if rec.State != answerComplete {
			return nil
		}
		done, _ := time.Parse(answerTimeFormat, *rec.CompletedAt)
		if !done.Before(cutoff) {
			return nil
		}
		if err := os.Remove(name); err != nil {
			return err
		}
		removed++
		return syncDir(filepath.Dir(name))
	})
	return removed, err
}
