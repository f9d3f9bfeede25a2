package cgroup

import (
	"errors"
	"fmt"
	"strings"
)

// match is what one cgroup path says about its process.
type match struct {
	owner Owner
	pod   bool // the path has a pod component
	ok    bool // and a container below it: owner is complete
}

// podRef is a pod component of a path.
type podRef struct {
	uid string
	qos string
	// inline is the "<runtime>:<id>" tail of containerd's
	// "<pod slice>:<runtime>:<id>" component, "" otherwise.
	inline string
}

// parsePath finds the first pod component of a cgroup path and the container
// directly below it.
func parsePath(path string) (match, error) {
	comps, err := splitPath(path)
	if err != nil {
		return match{}, err
	}
	for i := range comps {
		pod, found, err := podAt(comps, i)
		if err != nil {
			return match{}, err
		}
		if !found {
			continue
		}
		id, ok, err := containerOf(pod, comps[i+1:])
		if err != nil {
			return match{}, err
		}
		m := match{pod: true, ok: ok}
		if ok {
			m.owner = Owner{PodUID: pod.uid, ContainerID: id, QoS: pod.qos}
		}
		return m, nil
	}
	return match{}, nil
}

// splitPath splits an absolute path into its components: none for "/". ".."
// may only lead (a path relative to the reader's cgroup namespace).
func splitPath(path string) ([]string, error) {
	if path == "/" {
		return nil, nil
	}
	comps := strings.Split(path[1:], "/")
	leading := true
	for _, c := range comps {
		switch {
		case c == "":
			return nil, errors.New("empty path component")
		case c == ".." && !leading:
			return nil, errors.New(`".." after a named component`)
		}
		leading = leading && c == ".."
	}
	return comps, nil
}

// podAt says whether comps[i] is a pod component, in any of its forms.
func podAt(comps []string, i int) (podRef, bool, error) {
	c := comps[i]
	if slice, inline, hasColon := strings.Cut(c, ":"); hasColon {
		pod, found, err := systemdPod(slice)
		if !found || err != nil {
			return podRef{}, found, err
		}
		pod.inline = inline
		return pod, true, nil
	}
	if strings.HasSuffix(c, ".slice") {
		return systemdPod(c)
	}
	return cgroupfsPod(comps, i)
}

// systemdPod recognises "[<prefix>-]kubepods[-<qos>]-pod<uid>.slice".
func systemdPod(name string) (podRef, bool, error) {
	base, ok := strings.CutSuffix(name, ".slice")
	i := strings.LastIndex(base, "-pod")
	if !ok || i < 0 {
		return podRef{}, false, nil
	}
	qos, ok := systemdQoS(base[:i])
	if !ok {
		return podRef{}, false, nil
	}
	uid, err := canonicalUID(base[i+len("-pod"):])
	if err != nil {
		return podRef{}, false, fmt.Errorf("pod slice %q: %w", name, err)
	}
	return podRef{uid: uid, qos: qos}, true, nil
}

// systemdQoS maps the part of a pod slice's name before "-pod" to its QoS
// class; false when it is not a kubepods slice.
func systemdQoS(prefix string) (string, bool) {
	for _, q := range []struct{ name, qos string }{
		{"kubepods-burstable", QoSBurstable},
		{"kubepods-besteffort", QoSBestEffort},
		{"kubepods", QoSGuaranteed},
	} {
		if prefix == q.name || strings.HasSuffix(prefix, "-"+q.name) {
			return q.qos, true
		}
	}
	return "", false
}

// cgroupfsPod recognises "pod<uid>" under kubepods[/<qos>], or right after a
// leading ".." run where kubepods is out of sight. In the latter case a
// component that is not "pod"+UUID is simply not a pod.
func cgroupfsPod(comps []string, i int) (podRef, bool, error) {
	rest, ok := strings.CutPrefix(comps[i], "pod")
	if !ok {
		return podRef{}, false, nil
	}
	qos, certain, ok := cgroupfsContext(comps[:i])
	if !ok {
		return podRef{}, false, nil
	}
	uid, err := canonicalUID(rest)
	switch {
	case err != nil && certain:
		return podRef{}, false, fmt.Errorf("pod cgroup %q: %w", comps[i], err)
	case err != nil:
		return podRef{}, false, nil
	}
	return podRef{uid: uid, qos: qos}, true, nil
}

// cgroupfsContext looks at the parents of a cgroupfs "pod..." component: ok
// when they are where the kubelet puts pods, certain when kubepods is among
// them (not hidden by ".."), with the QoS class they imply ("" if hidden).
func cgroupfsContext(parents []string) (qos string, certain, ok bool) {
	n := len(parents)
	if n == 0 {
		return "", false, false
	}
	switch parent := parents[n-1]; parent {
	case "kubepods":
		return QoSGuaranteed, true, true
	case "..":
		return "", false, true
	case QoSBurstable, QoSBestEffort:
		if n >= 2 && (parents[n-2] == "kubepods" || parents[n-2] == "..") {
			return parent, parents[n-2] == "kubepods", true
		}
	}
	return "", false, false
}

// containerOf returns the container ID of a pod component: its inline part,
// else the pod cgroup's direct child. ok=false when there is none, or when it
// is conmon or not a known container form.
func containerOf(pod podRef, below []string) (string, bool, error) {
	if pod.inline != "" {
		runtime, id, found := strings.Cut(pod.inline, ":")
		if !found || runtime == "" {
			return "", false, fmt.Errorf("%q is not <runtime>:<id>", pod.inline)
		}
		return runtimeContainer(runtime, id, pod.inline)
	}
	if len(below) == 0 {
		return "", false, nil
	}
	return container(below[0])
}

// container parses a container cgroup's name: "<64hex>", or
// "<runtime>-<64hex>[.scope]".
func container(name string) (string, bool, error) {
	if id, ok := hex64(name); ok {
		return id, true, nil
	}
	base := strings.TrimSuffix(name, ".scope")
	i := strings.LastIndexByte(base, '-')
	if i < 0 {
		return "", false, nil
	}
	return runtimeContainer(base[:i], base[i+1:], name)
}

// runtimeContainer checks the ID of a container of the runtimes
// cri-containerd, crio and docker; other runtimes are not containers. CRI-O's
// "crio-conmon" is checked the same way but is not a container.
func runtimeContainer(runtime, id, name string) (string, bool, error) {
	switch runtime {
	case "cri-containerd", "crio", "docker", "crio-conmon":
	default:
		return "", false, nil
	}
	id, ok := hex64(id)
	switch {
	case !ok:
		return "", false, fmt.Errorf("container cgroup %q: ID is not 64 hex digits", name)
	case runtime == "crio-conmon":
		return "", false, nil
	}
	return id, true, nil
}

// canonicalUID checks a pod UID (dashes or systemd's underscores, any case)
// and returns it as 8-4-4-4-12 lowercase hex with dashes.
func canonicalUID(s string) (string, error) {
	if len(s) != 36 {
		return "", fmt.Errorf("UID %q is not a UUID", s)
	}
	b := make([]byte, len(s))
	for i := range len(s) {
		c := s[i]
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' && c != '_' {
				return "", fmt.Errorf("UID %q is not a UUID", s)
			}
			c = '-'
		case !isHex(c):
			return "", fmt.Errorf("UID %q is not a UUID", s)
		}
		b[i] = lower(c)
	}
	return string(b), nil
}

// hex64 returns s lowercased when it is exactly 64 hex digits.
func hex64(s string) (string, bool) {
	if len(s) != 64 {
		return "", false
	}
	b := make([]byte, len(s))
	for i := range len(s) {
		if !isHex(s[i]) {
			return "", false
		}
		b[i] = lower(s[i])
	}
	return string(b), true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
