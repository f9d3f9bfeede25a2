package benchreport

import (
	"fmt"
	"regexp"
	"strings"
)

// QuoteCommand renders args as one shell command line that gives back the
// same args: the form recorded in a raw file's header and shown in the
// tables. A flag's value is quoted after its "=" (-run='^$'), as people
// write it.
func QuoteCommand(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if name, val, ok := strings.Cut(a, "="); ok && strings.HasPrefix(name, "-") && shellSafe(name) {
			q[i] = name + "=" + shellQuote(val)
		} else {
			q[i] = shellQuote(a)
		}
	}
	return strings.Join(q, " ")
}

func shellSafe(s string) bool {
	return s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_@%+=:,./-", r))
	}) < 0
}

func shellQuote(s string) string {
	if shellSafe(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// SplitCommand splits a command line into its words as a POSIX shell does
// for quoting (single and double quotes, backslash); it expands nothing.
func SplitCommand(line string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case c == '\'':
			end := strings.IndexByte(line[i+1:], '\'')
			if end < 0 {
				return nil, fmt.Errorf("unterminated ' in %q", line)
			}
			w.WriteString(line[i+1 : i+1+end])
			i += end + 1
			inWord = true
		case c == '"':
			i++
			for ; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' && i+1 < len(line) && strings.IndexByte("\"\\$`", line[i+1]) >= 0 {
					i++
				}
				w.WriteByte(line[i])
			}
			if i == len(line) {
				return nil, fmt.Errorf("unterminated \" in %q", line)
			}
			inWord = true
		case c == '\\':
			if i+1 == len(line) {
				return nil, fmt.Errorf("trailing \\ in %q", line)
			}
			i++
			w.WriteByte(line[i])
			inWord = true
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// goTestValueFlag reports the go test and build flags that take a value, so
// that "-count 5" keeps its 5 and "./..." is known as the package list.
// Flags written as -name=value need no entry.
func goTestValueFlag(name string) bool {
	switch name {
	case "bench", "benchtime", "blockprofile", "blockprofilerate", "count", "coverpkg", "covermode",
		"coverprofile", "cpu", "cpuprofile", "exec", "fuzz", "fuzzminimizetime", "fuzztime", "list",
		"memprofile", "memprofilerate", "mutexprofile", "mutexprofilefraction", "o", "outputdir",
		"parallel", "run", "shuffle", "skip", "timeout", "trace", "vet",
		"C", "p", "asmflags", "buildmode", "compiler", "gccgoflags", "gcflags", "installsuffix",
		"ldflags", "mod", "modfile", "overlay", "pgo", "pkgdir", "tags", "toolexec":
		return true
	}
	return false
}

// Rerun narrows command, a `go test -bench` command line, to one benchmark:
// its -bench becomes the benchmark's full name, anchored at each level, and
// its packages become pkg alone (./dir inside module). Sub-benchmarks of
// the named one still run: go test cannot exclude them.
func Rerun(command, pkg, name, module string) (string, error) {
	args, err := SplitCommand(command)
	if err != nil {
		return "", err
	}
	t := -1
	for i, a := range args {
		if a == "test" {
			t = i
			break
		}
	}
	if t < 0 {
		return "", fmt.Errorf("%q is not a go test command", command)
	}
	out := append([]string{}, args[:t+1]...)
	bench := "-bench=" + benchPattern(name)
	hasBench := false
	var after []string // -args and what follows it go after the package
	for i := t + 1; i < len(args); i++ {
		a := args[i]
		if a == "-args" || a == "--args" {
			after = args[i:]
			break
		}
		if !strings.HasPrefix(a, "-") {
			continue // a package pattern: replaced by pkg
		}
		flag, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if flag == "bench" || flag == "test.bench" {
			out, hasBench = append(out, bench), true
			if !hasValue {
				i++
			}
			continue
		}
		out = append(out, a)
		if !hasValue && goTestValueFlag(flag) && i+1 < len(args) {
			i++
			out = append(out, args[i])
		}
	}
	if !hasBench {
		return "", fmt.Errorf("%q has no -bench flag", command)
	}
	dir := pkg
	if rest, ok := strings.CutPrefix(pkg, module); ok && module != "" && (rest == "" || rest[0] == '/') {
		dir = "." + rest
		if rest == "" {
			dir = "."
		}
	}
	out = append(out, dir)
	out = append(out, after...)
	return QuoteCommand(out), nil
}

// benchPattern is the -bench pattern that selects name: each slash-separated
// level anchored, as go test matches the levels one by one.
func benchPattern(name string) string {
	levels := strings.Split(name, "/")
	for i, l := range levels {
		levels[i] = "^" + regexp.QuoteMeta(l) + "$"
	}
	return strings.Join(levels, "/")
}
