package render

import (
	"encoding/json"
	"fmt"
	"io"

	"sigs.k8s.io/yaml"

	"github.com/gpushare/gpushare/inspector/collect"
)

// JSON writes the report as indented JSON, the schema of docs/inspector.md.
func JSON(w io.Writer, r *collect.Report) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode report as JSON: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// YAML writes the report as YAML with the JSON schema's field names.
func YAML(w io.Writer, r *collect.Report) error {
	b, err := yaml.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode report as YAML: %w", err)
	}
	_, err = w.Write(b)
	return err
}
