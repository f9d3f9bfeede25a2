package docs

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// flagInfo is one flag as a program's -h shows it.
type flagInfo struct {
	typ        string // "duration", "string", "value", ... ("" for bool)
	def        string // printed default, unquoted; "" when none is printed
	hasDefault bool
}

var (
	// Go's flag package: "  -name type" then an indented usage line.
	goFlagLine = regexp.MustCompile(`^  -([\w-]+)(?: (\w+))?$`)
	// pflag (cobra): "  -d, --details   usage" or "      --as string   usage".
	pflagLine = regexp.MustCompile(`^\s+(?:-(\w), )?--([\w-]+)(?: (\w+))?\s{2,}(.*)$`)
	// The default is printed last: "(default 5s)" or `(default "nvml")`.
	defaultSuffix = regexp.MustCompile(`\(default ([^()]*)\)$`)
	backticked    = regexp.MustCompile("`([^`]*)`")
)

func parseDefault(usage string) (string, bool) {
	m := defaultSuffix.FindStringSubmatch(strings.TrimSpace(usage))
	if m == nil {
		return "", false
	}
	if s, err := strconv.Unquote(m[1]); err == nil {
		return s, true
	}
	return m[1], true
}

// helpFlags runs bin -h and parses the flags it lists; names include shorthands for pflag.
func helpFlags(t *testing.T, bin string) map[string]flagInfo {
	t.Helper()
	cmd := exec.Command(bin, "-h")
	// The extender takes its defaults from PORT and LOG_LEVEL; the table documents them unset.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "PORT=") || strings.HasPrefix(kv, "LOG_LEVEL=")
	})
	out, _ := cmd.CombinedOutput() // -h exits 0 or 1 depending on the flag library
	flags := map[string]flagInfo{}
	var current string
	var usage strings.Builder
	flush := func() {
		if current == "" {
			return
		}
		f := flags[current]
		f.def, f.hasDefault = parseDefault(usage.String())
		flags[current] = f
		current = ""
		usage.Reset()
	}
	s := bufio.NewScanner(strings.NewReader(string(out)))
	for s.Scan() {
		line := s.Text()
		if m := goFlagLine.FindStringSubmatch(line); m != nil {
			flush()
			current = m[1]
			flags[current] = flagInfo{typ: m[2]}
			continue
		}
		if m := pflagLine.FindStringSubmatch(line); m != nil && !strings.HasPrefix(strings.TrimSpace(line), "#") {
			flush()
			def, has := parseDefault(m[4])
			f := flagInfo{typ: m[3], def: def, hasDefault: has}
			flags[m[2]] = f
			if m[1] != "" {
				flags[m[1]] = f
			}
			continue
		}
		if current != "" && strings.HasPrefix(line, "    \t") {
			usage.WriteString(strings.TrimPrefix(line, "    \t"))
			continue
		}
		flush()
	}
	flush()
	if len(flags) == 0 {
		t.Fatalf("%s -h listed no flags:\n%s", bin, out)
	}
	return flags
}

// readmeRow is one row of a README flag table.
type readmeRow struct {
	names []string
	def   string // first backticked token of the default cell, "" if none
}

// readmeTables returns each program's flag table: the first table after a "### `program`" heading
// under "## Flags".
func readmeTables(t *testing.T, path string) map[string][]readmeRow {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tables := map[string][]readmeRow{}
	var inFlags bool
	var program string
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			inFlags = line == "## Flags"
			program = ""
		case inFlags && strings.HasPrefix(line, "### "):
			program = strings.Trim(strings.TrimPrefix(line, "### "), "` ")
		case inFlags && program != "" && strings.HasPrefix(line, "|"):
			cells := strings.Split(strings.Trim(line, "|"), "|")
			if len(cells) < 3 || strings.TrimSpace(cells[0]) == "flag" || strings.HasPrefix(strings.TrimSpace(cells[0]), "---") {
				continue
			}
			var row readmeRow
			for _, m := range backticked.FindAllStringSubmatch(cells[0], -1) {
				row.names = append(row.names, strings.TrimLeft(m[1], "-"))
			}
			if m := backticked.FindStringSubmatch(cells[1]); m != nil {
				row.def = m[1]
			}
			tables[program] = append(tables[program], row)
		}
	}
	return tables
}

func sameDefault(typ, readme, printed string) bool {
	if typ == "duration" {
		a, errA := time.ParseDuration(readme)
		b, errB := time.ParseDuration(printed)
		return errA == nil && errB == nil && a == b
	}
	return readme == printed
}

// TestREADMEFlags: every flag each program has is in the README's table for it and every flag
// there exists, with the default the program prints.
func TestREADMEFlags(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := t.TempDir()
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		gobin = "go"
	}
	// -race: the build reuses the compiles of every dependency that make verify (vet -race) and
	// the race-detector tests made; a plain build compiled them all again (395 s on a cold CI
	// machine, 2026-12-05). Only --help runs.
	build := exec.Command(gobin, "build", "-race", "-o", bin+string(filepath.Separator), "./cmd/...")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/...: %v\n%s", err, out)
	}
	tables := readmeTables(t, filepath.Join(root, "README.md"))
	programs := []string{"gpushare-scheduler-extender", "gpushare-device-plugin", "kubectl-inspect-gpushare", "gpushare-webhook"}
	for _, program := range programs {
		t.Run(program, func(t *testing.T) {
			flags := helpFlags(t, filepath.Join(bin, program))
			rows := tables[program]
			if len(rows) == 0 {
				t.Fatalf("README.md has no flag table under ### `%s`", program)
			}
			documented := map[string]bool{}
			for _, row := range rows {
				for _, name := range row.names {
					documented[name] = true
					f, ok := flags[name]
					if !ok {
						t.Errorf("README documents -%s, which %s does not have", name, program)
						continue
					}
					if len(row.names) > 1 && len(row.names) != 2 {
						continue // a list of connection flags: names only
					}
					switch {
					case f.hasDefault && !sameDefault(f.typ, row.def, f.def):
						t.Errorf("-%s: README default %q, the program's is %q", name, row.def, f.def)
					case !f.hasDefault && row.def != "" && f.typ != "value":
						// A flag.Value whose default is its zero value prints none (bestfit); others must be empty.
						t.Errorf("-%s: README default %q, the program prints none", name, row.def)
					}
				}
			}
			for name := range flags {
				if !documented[name] {
					t.Errorf("%s has -%s, which README.md's table does not document", program, name)
				}
			}
		})
	}
	for program := range tables {
		if !slices.Contains(programs, program) {
			t.Errorf("README.md has a flag table for unknown program %q", program)
		}
	}
}
