// Package report prints what the real-GPU checks (mpscheck, dracheck) see,
// as text worth committing: sections, one [ok  ] or [FAIL] line per check,
// and a verdict naming the failed checks.
package report

import (
	"fmt"
	"strings"

	"go.uber.org/zap"
)

// Report prints the findings and counts failed checks.
type Report struct{ failed []string }

// Section starts a section.
func (r *Report) Section(title string) { fmt.Printf("\n## %s\n\n", title) }

// Say prints one line.
func (r *Report) Say(format string, args ...any) { fmt.Printf(format+"\n", args...) }

// Check prints one verdict line, remembers a failure, and returns ok.
func (r *Report) Check(name string, ok bool, detail string) bool {
	verdict := "ok  "
	if !ok {
		verdict = "FAIL"
		r.failed = append(r.failed, name)
	}
	fmt.Printf("[%s] %s: %s\n", verdict, name, detail)
	return ok
}

// Verdict prints PASS or FAIL with the failed checks and reports a pass.
func (r *Report) Verdict() bool {
	r.Section("Verdict")
	if len(r.failed) == 0 {
		r.Say("PASS")
		return true
	}
	r.Say("FAIL: %s", strings.Join(r.failed, "; "))
	return false
}

// ErrSuffix renders err for the end of a line, or nothing.
func ErrSuffix(err error) string {
	if err != nil {
		return " (error: " + err.Error() + ")"
	}
	return ""
}

// ErrText renders err, or ok when there is none.
func ErrText(err error, ok string) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return ok
}

// NewLogger writes the logs of the packages under test to stdout, in order
// with the report.
func NewLogger() *zap.Logger {
	cfg := zap.NewDevelopmentConfig()
	cfg.DisableStacktrace = true
	cfg.DisableCaller = true
	cfg.OutputPaths = []string{"stdout"}
	cfg.ErrorOutputPaths = []string{"stdout"}
	log, err := cfg.Build()
	if err != nil {
		return zap.NewNop()
	}
	return log
}
