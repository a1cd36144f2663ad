package main

import (
	"bytes"
	"encoding/json"
	"io"
	"slices"
	"strconv"
)

// Passthrough edits a few top-level members of a caller's JSON body (SPEC
// §7.6) by their byte spans; every other byte stays as sent, never re-encoded.

// jsonMember is one member's key (rawText) and offsets: its segment, from sep
// just after the previous value or '{', holds the comma; val:end is its value.
type jsonMember struct {
	key           []byte
	sep, val, end int
}

// rawObject is one JSON object split into members.
type rawObject struct {
	src     []byte
	members []jsonMember
}

// parseRawObject splits src, one JSON object, into its members (too deep a
// body was refused before any handler: state.go's depth scan).
func parseRawObject(src []byte) (rawObject, error) {
	if !json.Valid(src) {
		var v any
		return rawObject{}, decodeCallerJSON(src, &v, "")
	}
	return splitRawObject(src, make([]jsonMember, 0, 8))
}

// splitRawObject is parseRawObject for valid JSON, the members in scratch's
// storage (a hot loop splits one event after another).
func splitRawObject(src []byte, scratch []jsonMember) (rawObject, error) {
	o, ok := splitRaw(src, '{', scratch)
	if !ok {
		return o, refuse("invalid_request", "the request body must be a JSON object")
	}
	return o, nil
}

// splitRaw splits the valid JSON object or array (open '{' or '[') at the
// start of src into its members; an array's have no key.
func splitRaw(src []byte, open byte, scratch []jsonMember) (rawObject, bool) {
	i := skipJSONSpace(src, 0)
	if i >= len(src) || src[i] != open {
		return rawObject{}, false
	}
	o := rawObject{src: src, members: scratch[:0]}
	for i++; ; {
		sep := i
		i = skipJSONSpace(src, i)
		if src[i] == '}' || src[i] == ']' {
			return o, true
		}
		if src[i] == ',' {
			i = skipJSONSpace(src, i+1)
		}
		m := jsonMember{sep: sep, val: i}
		if open == '{' {
			keyEnd := skipJSONString(src, i)
			m.key, m.val = rawText(src[i:keyEnd]), skipJSONSpace(src, skipJSONSpace(src, keyEnd)+1) // past ':'
		}
		m.end = skipJSONValue(src, m.val)
		o.members = append(o.members, m)
		i = m.end
	}
}

// value is the raw value of the last member named key (encoding/json's
// rule for a repeated key), nil when absent.
func (o rawObject) value(key string) json.RawMessage {
	var v json.RawMessage
	for _, m := range o.members {
		if string(m.key) == key {
			v = o.src[m.val:m.end]
		}
	}
	return v
}

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
	out := bytes.NewBuffer(make([]byte, 0, len(o.src)+64))
	o.writeEdited(out, edits...)
	return out.Bytes()
}

// writeEdited writes edit's bytes to w piece by piece: a digest of them
// holds no copy of the body (the replay guard's, SPEC §17).
func (o rawObject) writeEdited(w io.Writer, edits ...memberEdit) {
	open := skipJSONSpace(o.src, 0) + 1 // just past '{'
	w.Write(o.src[:open])
	tail, first := open, true
	for _, m := range o.members {
		seg := o.src[m.sep:m.end]
		tail = m.end
		k := slices.IndexFunc(edits, func(e memberEdit) bool { return string(m.key) == e.key })
		if k >= 0 && edits[k].value == nil {
			continue
		}
		if j := skipJSONSpace(seg, 0); first && j < len(seg) && seg[j] == ',' {
			seg = seg[j+1:] // the first member written carries no separator
		}
		first = false
		if k >= 0 {
			w.Write(seg[:len(seg)-(m.end-m.val)])
			seg = edits[k].value
		}
		w.Write(seg)
	}
	for k, e := range edits {
		if e.value == nil || o.value(e.key) != nil || slices.ContainsFunc(edits[:k], func(p memberEdit) bool { return p.key == e.key }) {
			continue
		}
		if !first {
			w.Write([]byte{','})
		}
		first = false
		w.Write(append(append(strconv.AppendQuote(nil, e.key), ':'), e.value...)) // Brama's own keys are plain ASCII
	}
	w.Write(o.src[tail:])
}

// rawText is a JSON string's text, the source's bytes when it has no escapes
// (string(t) == "…" allocates nothing); nil for anything but a string.
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
