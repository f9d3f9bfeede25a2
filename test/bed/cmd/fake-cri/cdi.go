package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// CDI, as containerd applies it to a container it creates (enable_cdi): the devices a container
// asks for are its cdi.k8s.io/ annotations' values (comma-separated qualified names) and its CRI
// CDIDevices; each is resolved against the CDI specifications in the configured directories, and
// their container edits are applied to the container's OCI spec after the container's own
// configuration. A device that resolves to nothing fails the creation ("unresolvable CDI
// devices"), as containerd's does.
//
// fake-cri applies only the env edits (the only edits a fake container can show), reads only
// .json specifications (CDI also reads .yaml; the test bed writes JSON), and keeps CDI's rules for
// which device a name means: a specification file that cannot be read or is invalid contributes no
// device; a name defined twice in one directory is a conflict and resolves to nothing; a directory
// later in the list overrides an earlier one. Edits follow CDI's order: for each device in turn,
// its specification's own edits (once per specification) and then the device's, each NAME=value
// replacing an earlier value of NAME where it stands or else appended (a later one wins).

// cdiAnnotationPrefix prefixes the container annotations that request CDI devices.
const cdiAnnotationPrefix = "cdi.k8s.io/"

// cdiSpec is the part of a CDI specification fake-cri reads.
type cdiSpec struct {
	Version        string       `json:"cdiVersion"`
	Kind           string       `json:"kind"`
	Devices        []cdiDevice  `json:"devices"`
	ContainerEdits cdiEditsJSON `json:"containerEdits"`
}

type cdiDevice struct {
	Name           string       `json:"name"`
	ContainerEdits cdiEditsJSON `json:"containerEdits"`
}

// cdiEditsJSON holds the env edits; the other edits only need to be there for a device to be
// valid (CDI refuses a device without edits).
type cdiEditsJSON struct {
	Env         []string          `json:"env"`
	DeviceNodes []json.RawMessage `json:"deviceNodes"`
	Mounts      []json.RawMessage `json:"mounts"`
	Hooks       []json.RawMessage `json:"hooks"`
}

func (e cdiEditsJSON) empty() bool {
	return len(e.Env) == 0 && len(e.DeviceNodes) == 0 && len(e.Mounts) == 0 && len(e.Hooks) == 0
}

// resolvedDevice is one device found in a specification file.
type resolvedDevice struct {
	spec string   // the file, standing for its specification
	env  []string // the specification's env edits (applied once per specification)
	dev  []string // the device's env edits
}

// cdiRegistry is every device of the specification directories, by qualified name.
type cdiRegistry struct {
	devices   map[string]resolvedDevice
	conflicts map[string]bool
}

// loadCDI reads the specification directories, in priority order (the last wins).
func loadCDI(dirs []string) cdiRegistry {
	reg := cdiRegistry{devices: map[string]resolvedDevice{}, conflicts: map[string]bool{}}
	for _, dir := range dirs {
		files, _ := filepath.Glob(filepath.Join(dir, "*.json")) // a missing directory has no specs
		inDir := map[string]resolvedDevice{}
		conflicts := map[string]bool{}
		for _, f := range files {
			if info, err := os.Stat(f); err != nil || !info.Mode().IsRegular() {
				continue
			}
			devices, err := readCDISpec(f)
			if err != nil {
				fmt.Fprintf(os.Stderr, "fake-cri: CDI specification %s skipped: %v\n", f, err)
				continue
			}
			for name, d := range devices {
				if _, dup := inDir[name]; dup {
					conflicts[name] = true
				}
				inDir[name] = d
			}
		}
		for name, d := range inDir {
			// A higher-priority directory overrides, conflict or not.
			delete(reg.conflicts, name)
			if conflicts[name] {
				delete(reg.devices, name)
				reg.conflicts[name] = true
				continue
			}
			reg.devices[name] = d
		}
	}
	return reg
}

// readCDISpec reads one specification file and returns its devices by qualified name.
func readCDISpec(path string) (map[string]resolvedDevice, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s cdiSpec
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, err
	}
	if s.Version == "" {
		return nil, fmt.Errorf("no cdiVersion")
	}
	vendor, class, ok := strings.Cut(s.Kind, "/")
	if !ok || vendor == "" || class == "" || strings.ContainsAny(s.Kind, "=,") {
		return nil, fmt.Errorf("invalid kind %q", s.Kind)
	}
	if err := validEnv(s.ContainerEdits.Env); err != nil {
		return nil, err
	}
	out := map[string]resolvedDevice{}
	for _, d := range s.Devices {
		if d.Name == "" || strings.ContainsAny(d.Name, "=,/ ") {
			return nil, fmt.Errorf("invalid device name %q", d.Name)
		}
		if d.ContainerEdits.empty() {
			return nil, fmt.Errorf("device %q has no container edits", d.Name)
		}
		if err := validEnv(d.ContainerEdits.Env); err != nil {
			return nil, fmt.Errorf("device %q: %w", d.Name, err)
		}
		name := s.Kind + "=" + d.Name
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("device %q defined twice", d.Name)
		}
		out[name] = resolvedDevice{spec: path, env: s.ContainerEdits.Env, dev: d.ContainerEdits.Env}
	}
	return out, nil
}

// validEnv checks that every entry is NAME=value with a name, as CDI does.
func validEnv(env []string) error {
	for _, e := range env {
		if strings.IndexByte(e, '=') <= 0 {
			return fmt.Errorf("invalid environment variable %q", e)
		}
	}
	return nil
}

// requestedCDIDevices lists the CDI devices a container asks for, each once, in containerd's
// order (WithCDI): its CRI CDIDevices, then its cdi.k8s.io/ annotations' (values are
// comma-separated qualified names; keys taken in order here, where containerd's map has none).
func requestedCDIDevices(annotations map[string]string, cri []string) []string {
	var out []string
	add := func(name string) {
		if name = strings.TrimSpace(name); name != "" && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	for _, name := range cri {
		add(name)
	}
	for _, k := range slices.Sorted(maps.Keys(annotations)) {
		if strings.HasPrefix(k, cdiAnnotationPrefix) {
			for v := range strings.SplitSeq(annotations[k], ",") {
				add(v)
			}
		}
	}
	return out
}

// inject resolves devices in reg and returns env with their edits applied, or an error naming
// every device that resolves to nothing.
func (reg cdiRegistry) inject(env []keyValue, devices []string) ([]keyValue, error) {
	var unresolved []string
	var found []resolvedDevice
	for _, name := range devices {
		d, ok := reg.devices[name]
		if !ok {
			unresolved = append(unresolved, name)
			continue
		}
		found = append(found, d)
	}
	if len(unresolved) > 0 {
		return nil, fmt.Errorf("unresolvable CDI devices %s", strings.Join(unresolved, ", "))
	}
	out := slices.Clone(env)
	seenSpec := map[string]bool{}
	for _, d := range found {
		if !seenSpec[d.spec] {
			seenSpec[d.spec] = true
			out = setEnv(out, d.env)
		}
		out = setEnv(out, d.dev)
	}
	return out, nil
}

// setEnv applies NAME=value entries to env: each replaces NAME's value where it stands, or is
// appended.
func setEnv(env []keyValue, entries []string) []keyValue {
	for _, e := range entries {
		k, v, _ := strings.Cut(e, "=")
		env = setOne(env, k, v)
	}
	return env
}

func setOne(env []keyValue, k, v string) []keyValue {
	if i := slices.IndexFunc(env, func(kv keyValue) bool { return kv.Key == k }); i >= 0 {
		env[i].Value = v
		return env
	}
	return append(env, keyValue{Key: k, Value: v})
}

// effectiveEnv is a container's own environment as a runtime builds it: a later value of a name
// replaces an earlier one where it stands.
func effectiveEnv(envs []keyValue) []keyValue {
	var out []keyValue
	for _, kv := range envs {
		out = setOne(out, kv.Key, kv.Value)
	}
	return out
}
