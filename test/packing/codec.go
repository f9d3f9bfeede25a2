package packing

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
)

// header is the first line of a workload file: how it was generated.
type header struct {
	Format string  `json:"format"`
	Spec   GenSpec `json:"generated"`
}

const workloadFormat = "gpushare-packing-workload/v1"

// WriteWorkload writes pods as JSON lines after a header line with spec.
func WriteWorkload(w io.Writer, spec GenSpec, pods []Pod) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	if err := enc.Encode(header{Format: workloadFormat, Spec: spec}); err != nil {
		return err
	}
	for _, p := range pods {
		if err := enc.Encode(p); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// ReadWorkload reads what WriteWorkload wrote and checks it.
func ReadWorkload(r io.Reader) (GenSpec, []Pod, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	var h header
	var pods []Pod
	line := 0
	for sc.Scan() {
		line++
		if line == 1 {
			if err := json.Unmarshal(sc.Bytes(), &h); err != nil || h.Format != workloadFormat {
				return GenSpec{}, nil, fmt.Errorf("line 1: not a %s header (%v)", workloadFormat, err)
			}
			continue
		}
		var p Pod
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			return GenSpec{}, nil, fmt.Errorf("line %d: %w", line, err)
		}
		pods = append(pods, p)
	}
	if err := sc.Err(); err != nil {
		return GenSpec{}, nil, err
	}
	if line == 0 {
		return GenSpec{}, nil, fmt.Errorf("empty workload")
	}
	if err := CheckWorkload(pods); err != nil {
		return GenSpec{}, nil, err
	}
	return h.Spec, pods, nil
}
