package main

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
)

// Passthrough edits a caller's JSON body in place (SPEC §7.6): a few
// top-level members are replaced, removed or added, and every other byte
// stays as sent, in order. Members are found by their byte spans and new
// bytes spliced between them; a value left unchanged is never re-encoded.

// jsonMember is one member of a JSON object: its key (rawText) and offsets.
// Its segment starts at sep, just after the previous value or '{', so the
// separator before the key belongs to it; val and end bound its value.
type jsonMember struct {
	key           []byte
	sep, val, end int
}

// rawObject is one JSON object split into members.
type rawObject struct {
	src     []byte
	members []jsonMember
}

// parseRawObject splits src, which must be one JSON object, into its
// members; anything else is invalid_request. A caller body deeper than
// SPEC §8.2 allows was refused before any handler (state.go's depth scan).
func parseRawObject(src []byte) (rawObject, error) {
	if !json.Valid(src) {
		var v any
		return rawObject{}, decodeCallerJSON(src, &v, "")
	}
	return splitRawObject(src, make([]jsonMember, 0, 8))
}

// splitRawObject is parseRawObject for bytes known to be valid JSON, with
// the members kept in scratch's storage (a hot loop parses one event after
// another).
func splitRawObject(src []byte, scratch []jsonMember) (rawObject, error) {
	i := skipJSONSpace(src, 0)
	if i >= len(src) || src[i] != '{' {
		return rawObject{}, refuse("invalid_request", "the request body must be a JSON object")
	}
	o := rawObject{src: src, members: scratch[:0]}
	for i++; ; {
		sep := i
		i = skipJSONSpace(src, i)
		if src[i] == '}' {
			return o, nil
		}
		if src[i] == ',' {
			i = skipJSONSpace(src, i+1)
		}
		keyEnd := skipJSONString(src, i)
		val := skipJSONSpace(src, skipJSONSpace(src, keyEnd)+1) // past ':'
		end := skipJSONValue(src, val)
		o.members = append(o.members, jsonMember{key: rawText(src[i:keyEnd]), sep: sep, val: val, end: end})
		i = end
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
	open := skipJSONSpace(o.src, 0) + 1 // just past '{'
	out, tail := append(make([]byte, 0, len(o.src)+64), o.src[:open]...), open
	for _, m := range o.members {
		seg := o.src[m.sep:m.end]
		tail = m.end
		k := slices.IndexFunc(edits, func(e memberEdit) bool { return string(m.key) == e.key })
		if k >= 0 && edits[k].value == nil {
			continue
		}
		if j := skipJSONSpace(seg, 0); len(out) == open && j < len(seg) && seg[j] == ',' {
			seg = seg[j+1:] // the first member written carries no separator
		}
		if k >= 0 {
			out = append(out, seg[:len(seg)-(m.end-m.val)]...)
			seg = edits[k].value
		}
		out = append(out, seg...)
	}
	for k, e := range edits {
		if e.value == nil || o.value(e.key) != nil || slices.ContainsFunc(edits[:k], func(p memberEdit) bool { return p.key == e.key }) {
			continue
		}
		if len(out) > open {
			out = append(out, ',')
		}
		out = append(append(strconv.AppendQuote(out, e.key), ':'), e.value...) // Brama's own keys are plain ASCII
	}
	return append(out, o.src[tail:]...)
}

// rawText is the text of a JSON string value: bytes of the source when it
// has no escapes (compare as string(t) == "…", no allocation), else
// decoded; nil when raw is not a string.
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
