package main

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
)

// Passthrough edits a caller's JSON body in place (SPEC §7.6): a few
// top-level members are replaced, removed or added, and every other byte
// stays as the caller sent it, in order. This file finds the members of an
// object by their byte spans and splices new bytes between them; it never
// re-encodes a value it does not change.

// jsonMember is one member of a JSON object: its decoded key and byte
// offsets into the object. sep is where the member's segment starts (just
// after the previous value, or just after '{'), so the separator and
// whitespace before the key belong to it; val and end bound its value.
type jsonMember struct {
	key           string // set only when the key has escapes; else src[keyAt+1:keyEnd-1]
	keyAt, keyEnd int
	sep, val, end int
}

// is reports whether the member's key is key.
func (o rawObject) is(m jsonMember, key string) bool {
	if m.key != "" {
		return m.key == key
	}
	return string(o.src[m.keyAt+1:m.keyEnd-1]) == key
}

// rawObject is one JSON object split into members.
type rawObject struct {
	src     []byte
	members []jsonMember
}

// parseRawObject splits src, which must be one JSON object, into its
// members. Malformed JSON or a body that is not an object is refused as
// invalid_request; a caller body deeper than SPEC §8.2 allows was refused
// before any handler (state.go's depth scan).
func parseRawObject(src []byte) (rawObject, error) {
	return parseRawObjectInto(src, nil)
}

// parseRawObjectInto is parseRawObject keeping the members in scratch's
// storage, for a hot loop that parses one object after another.
func parseRawObjectInto(src []byte, scratch []jsonMember) (rawObject, error) {
	if !json.Valid(src) {
		var v any
		return rawObject{}, decodeCallerJSON(src, &v, "")
	}
	return splitRawObject(src, scratch)
}

// splitRawObject is parseRawObjectInto for bytes already known to be
// valid JSON, such as a member of a parsed object.
func splitRawObject(src []byte, scratch []jsonMember) (rawObject, error) {
	i := skipJSONSpace(src, 0)
	if i >= len(src) || src[i] != '{' {
		return rawObject{}, refuse("invalid_request", "the request body must be a JSON object")
	}
	o := rawObject{src: src, members: scratch[:0]}
	i++
	for {
		sep := i
		i = skipJSONSpace(src, i)
		if src[i] == '}' {
			return o, nil
		}
		if src[i] == ',' {
			i = skipJSONSpace(src, i+1)
		}
		keyAt, keyEnd := i, skipJSONString(src, i)
		var key string
		if bytes.IndexByte(src[keyAt:keyEnd], '\\') >= 0 {
			key = unescapedKey(src[keyAt:keyEnd])
		}
		i = skipJSONSpace(src, keyEnd)
		val := skipJSONSpace(src, i+1) // past ':'
		end := skipJSONValue(src, val)
		if o.members == nil {
			o.members = make([]jsonMember, 0, 8)
		}
		o.members = append(o.members, jsonMember{key: key, keyAt: keyAt, keyEnd: keyEnd, sep: sep, val: val, end: end})
		i = end
	}
}

// unescapedKey decodes a key that has escapes (kept apart so the common
// key without escapes costs no allocation).
func unescapedKey(quoted []byte) string {
	var key string
	json.Unmarshal(quoted, &key) // valid JSON: cannot fail
	return key
}

// value is the raw value of the last member named key (encoding/json's
// rule for a repeated key), nil when absent.
func (o rawObject) value(key string) json.RawMessage {
	var v json.RawMessage
	for _, m := range o.members {
		if o.is(m, key) {
			v = o.src[m.val:m.end]
		}
	}
	return v
}

// has reports whether a member named key is present (even as null).
func (o rawObject) has(key string) bool { return o.value(key) != nil }

// memberEdit replaces every member named key with value, or adds it at
// the end of the object when absent; a nil value removes the member.
type memberEdit struct {
	key   string
	value []byte
}

// edit returns the object with edits applied and every other byte kept.
func (o rawObject) edit(edits ...memberEdit) []byte {
	if len(edits) == 0 {
		return o.src
	}
	out := make([]byte, 0, len(o.src)+64)
	last := skipJSONSpace(o.src, 0) + 1 // just past '{'
	out = append(out, o.src[:last]...)
	done := make([]bool, len(edits))
	wrote := false
	for _, m := range o.members {
		seg := o.src[m.sep:m.end]
		k := o.editFor(edits, m)
		if k >= 0 && edits[k].value == nil {
			continue
		}
		if !wrote { // the first member written carries no separator
			if j := skipJSONSpace(seg, 0); j < len(seg) && seg[j] == ',' {
				seg = seg[j+1:]
			}
		}
		if k >= 0 {
			done[k] = true
			head := len(seg) - (m.end - m.val)
			out = append(out, seg[:head]...)
			out = append(out, edits[k].value...)
		} else {
			out = append(out, seg...)
		}
		wrote = true
	}
	for k, e := range edits {
		if done[k] || e.value == nil || slices.ContainsFunc(edits[:k], func(p memberEdit) bool { return p.key == e.key }) {
			continue
		}
		if wrote {
			out = append(out, ',')
		}
		out = strconv.AppendQuote(out, e.key) // Brama's own keys are plain ASCII
		out = append(out, ':')
		out = append(out, e.value...)
		wrote = true
	}
	tail := len(o.src)
	if n := len(o.members); n > 0 {
		tail = o.members[n-1].end
	} else {
		tail = last
	}
	return append(out, o.src[tail:]...)
}

// rawText is the text of a JSON string value without escapes, as bytes of
// the source (no copy), or decoded when it has escapes; nil when raw is
// not a string. Compare it as string(t) == "…" to avoid allocating.
func rawText(raw []byte) []byte {
	if len(raw) < 2 || raw[0] != '"' {
		return nil
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw[1 : len(raw)-1]
	}
	var s string
	json.Unmarshal(raw, &s)
	return []byte(s)
}

// rawArray splits a (valid) JSON array into its elements' bytes, kept in
// scratch's storage; anything else has none.
func rawArray(b []byte, scratch [][]byte) [][]byte {
	i := skipJSONSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil
	}
	out := scratch[:0]
	for i = skipJSONSpace(b, i+1); i < len(b) && b[i] != ']'; i = skipJSONSpace(b, i) {
		if b[i] == ',' {
			i = skipJSONSpace(b, i+1)
		}
		end := skipJSONValue(b, i)
		out = append(out, b[i:end])
		i = end
	}
	return out
}

// editFor is the index of the edit for m's key, or -1.
func (o rawObject) editFor(edits []memberEdit, m jsonMember) int {
	for i, e := range edits {
		if o.is(m, e.key) {
			return i
		}
	}
	return -1
}

// skipJSONSpace returns the index of the first non-space byte at or after i.
func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipJSONString returns the index just past the string that opens at i.
func skipJSONString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// skipJSONValue returns the index just past the (valid) value at i. It
// counts brackets without recursion, so no depth can exhaust a stack.
func skipJSONValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipJSONString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipJSONString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return len(b)
	}
	for ; i < len(b); i++ {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
	}
	return i
}
