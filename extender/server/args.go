package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// initialBodyBuffer caps the buffer readBody allocates before any byte of
// the body has arrived.
const initialBodyBuffer = 64 << 10

// readBody reads r whole; r itself enforces the limit. The buffer grows with
// what actually arrives: it starts at the request's Content-Length when that
// is at most initialBodyBuffer (one allocation for the common small body),
// else at initialBodyBuffer, so a client announcing a large body and sending
// nothing costs 64 KiB, not the announced size.
func readBody(r io.Reader, contentLength, limit int64) ([]byte, error) {
	size := min(int64(initialBodyBuffer), limit)
	if contentLength > 0 && contentLength < size {
		size = contentLength
	}
	buf := bytes.NewBuffer(make([]byte, 0, size+bytes.MinRead))
	_, err := buf.ReadFrom(r)
	return buf.Bytes(), err
}

// wireArgs is extenderv1.ExtenderArgs as it arrives, its node names left raw
// for parseNodeNames. The field names match the upstream type's, and so its
// JSON keys (matched case-insensitively, as encoding/json does).
type wireArgs struct {
	Pod       *corev1.Pod
	Nodes     *corev1.NodeList
	NodeNames json.RawMessage
}

// unmarshalExtenderArgs decodes a filter or prioritize body. With
// nodeCacheCapable the scheduler sends every candidate's name (thousands in
// a large cluster), and encoding/json allocates a string for each one; the
// names are instead cut from one string (see parseNodeNames).
func unmarshalExtenderArgs(body []byte) (*extenderv1.ExtenderArgs, error) {
	var w wireArgs
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, err
	}
	args := &extenderv1.ExtenderArgs{Pod: w.Pod, Nodes: w.Nodes}
	if len(w.NodeNames) > 0 && !bytes.Equal(w.NodeNames, []byte("null")) {
		names, err := parseNodeNames(w.NodeNames)
		if err != nil {
			return nil, fmt.Errorf("NodeNames: %w", err)
		}
		args.NodeNames = &names
	}
	return args, nil
}

// parseNodeNames reads a JSON array of strings. Node names are DNS
// subdomains, plain ASCII: each is cut from a single string copy of raw, so
// the whole list costs two allocations. Anything else (an escape, a
// non-ASCII byte, a null, malformed JSON) goes through encoding/json, whose
// result and errors are the reference.
func parseNodeNames(raw []byte) ([]string, error) {
	if names, ok := cutNames(string(raw)); ok {
		return names, nil
	}
	var names []string
	if err := json.Unmarshal(raw, &names); err != nil {
		return nil, err
	}
	return names, nil
}

// cutNames returns the strings of all, a JSON array of plain-ASCII strings
// without escapes, as substrings of it; false for any other text.
func cutNames(all string) ([]string, bool) {
	i := skipSpace(all, 0)
	if i >= len(all) || all[i] != '[' {
		return nil, false
	}
	i = skipSpace(all, i+1)
	names := make([]string, 0, strings.Count(all, ",")+1)
	if i < len(all) && all[i] == ']' {
		return names, skipSpace(all, i+1) == len(all)
	}
	for {
		if i >= len(all) || all[i] != '"' {
			return nil, false
		}
		start := i + 1
		j := start
		for ; j < len(all) && all[j] != '"'; j++ {
			if c := all[j]; c == '\\' || c < 0x20 || c >= 0x80 {
				return nil, false
			}
		}
		if j >= len(all) {
			return nil, false
		}
		names = append(names, all[start:j])
		i = skipSpace(all, j+1)
		if i < len(all) && all[i] == ']' {
			return names, skipSpace(all, i+1) == len(all)
		}
		if i >= len(all) || all[i] != ',' {
			return nil, false
		}
		i = skipSpace(all, i+1)
	}
}

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}
